"""What `trends query` prints is escaped: an item that reached the views with terminal control sequences in it
(written to Kafka directly, not through `trends ingest`) cannot drive the operator's terminal.

The items are put into a real batch view in Cassandra, then the real commands read them back.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner

from batch_layer.publish import BatchStore
from infra import migrations
from infra.cassandra import session
from infra.security import CONTROL_CHARS
from infra.settings import Settings
from serving.cli import query
from tests.helpers import drop_keyspace
from views.store.rows import ViewRow

HOUR = datetime(2025, 6, 1, 10, tzinfo=UTC)
EVIL = {
    "#clear\x1b[2J\x1b[H": 30,  # ESC: clear the screen
    "#title\x1b]0;pwned\x07": 20,  # OSC: set the window title
    "#csi\x9b31m": 10,  # a one-byte C1 CSI
    "#nul\x00end": 8,
    "#plain": 5,
}


@pytest.fixture
def evil_view(stack_up: Settings) -> Iterator[Settings]:
    import datasketches as ds

    keyspace = f"test_tty_{random.randrange(1 << 30)}"
    settings = stack_up.model_copy(update={"cassandra": stack_up.cassandra.model_copy(update={"keyspace": keyspace})})
    migrations.migrate(settings)
    try:
        with session(settings) as sess:
            store = BatchStore(settings, sess)
            hll, kll, fi = ds.hll_sketch(12), ds.kll_doubles_sketch(200), ds.frequent_strings_sketch(10)
            for item, count in EVIL.items():
                fi.update(item, count)
                hll.update(item)
                kll.update(float(count))
            sketches = (bytes(hll.serialize_compact()), bytes(kll.serialize()), bytes(fi.serialize()))
            run = uuid.uuid1()
            total = sum(EVIL.values())
            row = ViewRow("*", HOUR, total, *sketches, HOUR, HOUR)
            store.rows.write_versions({HOUR: run}, {HOUR: [row]}, {HOUR: [row]})
            store.pointers.swap([(HOUR, run, None)])
            store.pointers.write_watermark(HOUR - timedelta(hours=2), HOUR + timedelta(hours=1))
        yield settings
    finally:
        drop_keyspace(stack_up, keyspace)


def _run(settings: Settings, *args: str) -> str:
    # color=True: click would otherwise strip ANSI CSI sequences itself, and the test could not fail.
    result = CliRunner().invoke(query, list(args), obj=settings, color=True)
    assert result.exit_code == 0, result.output
    return result.output


def _window() -> list[str]:
    return ["--start", HOUR.isoformat(), "--end", (HOUR + timedelta(hours=1)).isoformat()]


@pytest.mark.parametrize("args", [["summary", "--top", "10"], ["trending", "--baseline", "1h", "--min-support", "1"]])
def test_query_output_escapes_control_characters(evil_view: Settings, args: list[str]) -> None:
    out = _run(evil_view, *args, *_window())
    assert CONTROL_CHARS.search(out.replace("\n", "")) is None, repr(out)
    for shown in ("#clear\\x1b[2J\\x1b[H", "#title\\x1b]0;pwned\\x07", "#csi\\x9b31m", "#nul\\x00end", "#plain"):
        assert shown in out, out


def test_query_json_output_keeps_the_items_as_json_escapes(evil_view: Settings) -> None:
    """A regression guard: the JSON output is escaped by json.dumps (ensure_ascii), and must stay so."""
    out = _run(evil_view, "summary", "--top", "10", "--json", *_window())
    assert CONTROL_CHARS.search(out.replace("\n", "")) is None
    items = {t["item"]: t["estimate"] for t in json.loads(out)["top_items"]}
    assert items == EVIL  # the same values, exactly, for scripts
