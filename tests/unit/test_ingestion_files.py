"""File readers and column mappings: bounded reads, CSV records across lines, gzip, same events from CSV and JSONL."""

from __future__ import annotations

import gzip
import io
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ingestion.files import (
    MAX_CSV_RECORD_LINES,
    SourceError,
    detect_format,
    open_source,
    outcomes,
    read_csv,
    read_lines,
)
from ingestion.mapping import ColumnMapping, MappingError
from ingestion.validate import MAX_RECORD_BYTES, Context, Reason, Reject
from views.event import Event

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def test_lines_keep_their_numbers_and_bytes_and_skip_blank_lines() -> None:
    data = b'\xef\xbb\xbf{"a": 1}\r\n\n   \n{"b": 2}\n{"c": 3}'
    records = list(read_lines(io.BytesIO(data)))
    assert [(r.raw, r.line, r.size) for r in records] == [
        (b'{"a": 1}', 1, None),
        (b'{"b": 2}', 4, None),
        (b'{"c": 3}', 5, None),
    ]


def test_an_overlong_line_is_cut_and_measured_and_the_next_line_survives() -> None:
    long_line = b"x" * (3 * MAX_RECORD_BYTES + 5)
    records = list(read_lines(io.BytesIO(b"first\n" + long_line + b"\r\nlast\n")))
    assert [r.line for r in records] == [1, 2, 3]
    cut = records[1]
    assert cut.size == len(long_line)
    assert len(cut.raw) <= MAX_RECORD_BYTES + 2
    assert records[2].raw == b"last"


def test_csv_records_may_span_lines_inside_quotes() -> None:
    data = b'id,item,note\n1,a,"two\nlines"\n2,b,"say ""hi"""\n3,c,plain\n'
    header, records = read_csv(io.BytesIO(data))
    assert header == ["id", "item", "note"]
    got = [(r.raw, r.line) for r in records]
    assert got == [(b'1,a,"two\nlines"', 2), (b'2,b,"say ""hi"""', 4), (b"3,c,plain", 5)]


def test_an_unbalanced_csv_quote_cannot_swallow_the_file() -> None:
    rows = [b'1,a,"never closed'] + [f"{i},b,c".encode() for i in range(2, 300)]
    _header, records = read_csv(io.BytesIO(b"id,item,note\n" + b"\n".join(rows) + b"\n"))
    got = list(records)
    assert got[0].line == 2
    assert got[0].raw.count(b"\n") == MAX_CSV_RECORD_LINES - 1
    assert got[1].line == 2 + MAX_CSV_RECORD_LINES  # reading resumes right after the bounded record
    assert got[-1].raw == b"299,b,c"


def test_a_csv_without_a_readable_header_is_a_source_error() -> None:
    with pytest.raises(SourceError):
        read_csv(io.BytesIO(b""))
    with pytest.raises(SourceError):
        read_csv(io.BytesIO(b"a,b,a\n1,2,3\n"))


def test_formats_come_from_names_or_are_asked_for() -> None:
    assert detect_format("x/events.jsonl.gz") == "jsonl"
    assert detect_format("clicks.CSV") == "csv"
    assert detect_format("-") == "jsonl"
    assert detect_format("dump.txt", "csv") == "csv"
    with pytest.raises(SourceError):
        detect_format("dump.txt")


def test_gzip_is_recognised_by_its_magic_bytes(tmp_path: Path) -> None:
    path = tmp_path / "no-suffix.jsonl"
    with gzip.open(path, "wb") as fh:
        fh.write(b'{"ts": 1, "item": "x"}\n' * 3)
    with open_source(str(path)) as source:
        assert [r.raw for r in read_lines(source.stream)] == [b'{"ts": 1, "item": "x"}'] * 3
        assert source.position is not None and source.size == path.stat().st_size


def test_mapping_words_are_parsed_and_checked() -> None:
    mapping = ColumnMapping.parse(["ts=when", "item=page"], ["country", "os=platform"], time_format="epoch_ms")
    assert mapping.column("ts") == "when" and mapping.column("user") == "user"
    assert dict(mapping.dims) == {"country": "country", "os": "platform"}
    for bad in (["when"], ["colour=red"], ["=x"]):
        with pytest.raises(MappingError):
            ColumnMapping.parse(bad)
    with pytest.raises(MappingError):
        ColumnMapping(time_format="weekly")
    with pytest.raises(MappingError):
        ColumnMapping(assume_tz="Mars/Olympus")


def test_dotted_columns_reach_into_nested_json() -> None:
    mapping = ColumnMapping.parse(["user=actor.id", "item=target.page"], ["country=geo.cc"])
    fields = mapping.apply({"ts": 1, "actor": {"id": "u9"}, "target": {"page": "/p"}, "geo": {"cc": "FR"}})
    assert fields == {"ts": 1, "user": "u9", "item": "/p", "dims": {"country": "FR"}}


ROWS = [
    {"event_id": "e1", "when": "2025-11-22 10:00:00.250", "page": "/home", "uid": "u1", "ms": 12.5, "cc": "DE"},
    {"event_id": "", "when": "2025-11-22 10:00:01.000", "page": "/cart", "uid": "", "ms": None, "cc": "FR"},
    {"event_id": "e3", "when": "2025-11-22 10:00:02.500", "page": "/buy, now", "uid": "u3", "ms": 0.5, "cc": ""},
]
MAPPING = ColumnMapping.parse(
    ["id=event_id", "ts=when", "item=page", "user=uid", "value=ms"],
    ["country=cc"],
    dims_column=None,
    time_format="%Y-%m-%d %H:%M:%S.%f",
    assume_tz="UTC",
)


def write_csv_and_jsonl(tmp_path: Path) -> tuple[Path, Path]:
    """Write the same rows as CSV (gzip) and as JSONL (absent values left out)."""
    import csv

    csv_path = tmp_path / "rows.csv.gz"
    with gzip.open(csv_path, "wt", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(ROWS[0]))
        writer.writeheader()
        writer.writerows([{k: "" if v is None else v for k, v in row.items()} for row in ROWS])
    jsonl_path = tmp_path / "rows.jsonl"
    jsonl_path.write_text(
        "".join(json.dumps({k: v for k, v in row.items() if v not in ("", None)}) + "\n" for row in ROWS)
    )
    return csv_path, jsonl_path


def test_csv_and_jsonl_with_a_mapping_give_the_same_events(tmp_path: Path) -> None:
    csv_path, jsonl_path = write_csv_and_jsonl(tmp_path)
    ctx = Context(source="?", now=NOW, mapping=MAPPING)
    results = {}
    for path, fmt in ((csv_path, "csv"), (jsonl_path, "jsonl")):
        with open_source(str(path)) as source:
            results[fmt] = [o for _r, o in outcomes(source, str(path), fmt, ctx, refresh_clock=False)]
    assert all(isinstance(o, Event) for o in results["csv"] + results["jsonl"]), results
    assert [o.to_json() for o in results["csv"]] == [o.to_json() for o in results["jsonl"]]  # type: ignore[union-attr]
    second = results["csv"][1]
    assert isinstance(second, Event) and second.id.startswith("c-") and second.user is None


def test_rejects_carry_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b'{"ts": 1, "item": "ok"}\n\nnot json\n{"ts": 2, "item": "ok2"}\n')
    with open_source(str(path)) as source:
        got = [o for _r, o in outcomes(source, str(path), "jsonl", Context(source="?", now=NOW))]
    assert [type(o).__name__ for o in got] == ["Event", "Reject", "Event"]
    reject = got[1]
    assert isinstance(reject, Reject)
    assert (reject.reason, reject.source, reject.line, reject.raw) == (Reason.MALFORMED_JSON, str(path), 3, b"not json")


class _Recorder:
    """Records what a replay hands the producer, in order (no Kafka: this checks the replay's own output)."""

    key_field = "item"
    pseudonymiser = None  # the replay's own output, raw users (tests/unit/test_privacy.py pseudonymises)

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes | None, int | str, int | None]] = []

    def produce(self, event: Event) -> None:
        self.sent.append(("event", event.to_json(), event.key(self.key_field), event.ts_ms, None))

    def produce_encoded(self, value: bytes, key: bytes | None, ts_ms: int) -> None:
        self.sent.append(("event", value, key, ts_ms, None))

    def produce_many(self, values: list[bytes], keys: list[bytes | None], stamps: list[int]) -> None:
        self.sent.extend(("event", v, k, t, None) for v, k, t in zip(values, keys, stamps, strict=True))

    def produce_reject(self, reject: Reject) -> None:
        self.sent.append(("reject", reject.raw, None, str(reject.reason), reject.line))

    def poll(self, timeout: float = 0) -> None:
        pass


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_replay_in_worker_processes_produces_what_one_process_does_in_the_same_order(tmp_path: Path, fmt: str) -> None:
    from typing import Any, cast

    from infra.settings import Settings
    from ingestion.files import BATCH_RECORDS, replay

    n = 2 * BATCH_RECORDS + 123  # three batches, the last one short
    lines: list[bytes] = []
    for i in range(n):
        ts = f"2026-11-{1 + i % 20:02d}T10:00:{i % 60:02d}.{i % 1000:03d}Z"
        if fmt == "csv":
            lines.append(b"id,ts,item,user" if i == 0 else f"e{i},{ts},#i{i % 7},u{i % 5}".encode())
            if i % 97 == 0 and i:
                lines[-1] = f"e{i},not a time,#i{i % 7},u".encode()
        else:
            event = {"id": f"e{i}", "ts": ts, "item": f"#i{i % 7}", "user": f"u{i % 5}", "value": i / 3}
            lines.append(json.dumps(event).encode())
            if i % 97 == 0:
                lines[-1] = [b"{broken", b'{"ts": "2026-11-01T00:00:00Z"}', b"[1]", b'{"id":"x","ts":1,"item":""}'][
                    i % 4
                ]
    path = tmp_path / f"events.{fmt}"
    path.write_bytes(b"\n".join(lines) + b"\n")
    got: dict[int, list[Any]] = {}
    for workers in (1, 2):
        recorder = _Recorder()
        stats = replay(Settings(), cast("Any", recorder), str(path), workers=workers)
        assert stats.records == (n - 1 if fmt == "csv" else n)
        got[workers] = recorder.sent
    for topic in ("event", "reject"):  # each topic gets the same records in the same order
        assert [s for s in got[2] if s[0] == topic] == [s for s in got[1] if s[0] == topic]
    assert sum(1 for s in got[1] if s[0] == "reject") >= n // 97 - 1
    assert [s[1] for s in got[2] if s[0] == "event"][:3] == [s[1] for s in got[1] if s[0] == "event"][:3]


def test_one_process_resolves_a_batch_of_users_at_once_and_passes_every_record_on() -> None:
    """A replay in one process asks the subject store once per batch, not once per event."""
    from typing import Any, cast

    from ingestion.files import BATCH_RECORDS, RawRecord, _resolved_ahead
    from views.event import Event

    class Store:
        calls: list[tuple[list[str], list[tuple[str, int]]]] = []  # noqa: RUF012 - one test's record

        def table(self, users: dict[str, None], hours: list[tuple[str, int]]) -> dict[str, str]:
            self.calls.append((list(users), hours))
            return {u: f"p_{u}" for u in users}

    t = datetime(2026, 11, 1, tzinfo=UTC)
    records: list[tuple[Any, Any]] = []
    for i in range(BATCH_RECORDS + 5):
        event = Event(id=f"e{i}", ts=t, item="#a", user=f"u{i % 3}" if i % 2 else None)
        reject = Reject(b"{", Reason.MALFORMED_JSON, "x", "f", i, t)
        records.append((RawRecord(raw=b"", line=i), event if i % 10 else reject))
    store = Store()
    out = list(_resolved_ahead(iter(records), cast("Any", store)))
    assert out == records
    assert len(store.calls) == 2
    assert sorted(store.calls[0][0]) == ["u0", "u1", "u2"]
    assert all(ts == int(t.timestamp() * 1000) for _u, ts in store.calls[0][1])
    assert list(_resolved_ahead(iter(records), None)) == records
