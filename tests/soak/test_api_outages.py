"""The API's memory across repeated Cassandra outages: a step that levels off, not one that comes back each time.

The 60-minute soak stops Cassandra once, and the API workers' RSS steps up a few MiB when it returns. One outage cannot
tell a high-water mark from a leak per reconnection, so this stops Cassandra again and again under a polled
``trends serve --workers 2``. The first ``WARM_OUTAGES`` reach the high-water mark; then outages alternate with quiet
spells of the same length, and the outages may add little more than the quiet spells do. The quiet spells are the
control: the workers may also grow slowly with time (a few %/h in the soak), which an outage count alone would blame
on the outages. Threads and open files are bounded too. Writes ``artifacts/api-outages.md``.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from infra import migrations
from infra.settings import Settings
from stack import control
from stack.services.pipeline import ApiService
from tests.helpers import free_port
from tests.soak.private_stack import private_settings
from tests.soak.probe import Poller, api_workers

pytestmark = [pytest.mark.soak, pytest.mark.timeout(2400)]

WARM_OUTAGES = 4  # the steps here: +5.8..6.5, +2.0..2.7, then under 1 MiB each
PAIRS = 4  # then a quiet spell and an outage, this many times
DOWN_S = 30  # as the soak's Cassandra fault
SETTLE_S = 90  # after Cassandra accepts clients: the API reconnects and answers again within it
# Both workers, the PAIRS outages against the PAIRS quiet spells: a leak of 1 MiB per reconnection adds 4 MiB. Four
# runs without the control added 0.3, 1.1, 1.3 and 2.1 MiB over their last four outages, ~0.3 MiB per 2 minutes,
# which a rule on outages alone cannot tell from the workers' slow growth with time; the quiet spells measure that.
EXCESS_MIB = 2.0
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"


def _settings(root: Path) -> Settings:
    return private_settings(root, serving={"port": free_port(), "workers": 2, "cache_mb": 2, "answer_cache_mb": 1})


@dataclass(frozen=True)
class Reading:
    """Both workers together after a spell: RSS, threads and open files."""

    spell: str
    rss_mib: float
    threads: int
    files: int


def _read(api: ApiService, spell: str) -> Reading:
    workers = api_workers(api)
    assert len(workers) == 2, [w.cmdline() for w in workers]
    return Reading(
        spell,
        sum(w.memory_info().rss for w in workers) / 2**20,
        sum(w.num_threads() for w in workers),
        sum(w.num_fds() for w in workers),
    )


def _outage(settings: Settings, poller: Poller, k: int) -> None:
    control.down(settings, ["cassandra"])
    time.sleep(DOWN_S)
    answered = poller.statuses["200"]
    control.up(settings, ["cassandra"])
    time.sleep(SETTLE_S)
    assert poller.statuses["200"] > answered, f"outage {k}: no answer within {SETTLE_S} s: {poller.statuses}"


def test_the_api_memory_levels_off_across_cassandra_outages(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    api = ApiService(settings)
    spells = ["outage"] * WARM_OUTAGES + ["quiet", "outage"] * PAIRS
    try:
        control.up(settings, ["cassandra"])
        migrations.migrate(settings)
        control.up(settings, ["api"])
        poller = Poller(f"http://{api.host}:{api.client_port}", every_s=0.25, fresh_connections=True)
        poller.start()
        try:
            time.sleep(120)  # the caches fill (an empty keyspace: small answers)
            readings = [_read(api, "start")]
            for k, spell in enumerate(spells, start=1):
                if spell == "outage":
                    _outage(settings, poller, k)
                else:
                    time.sleep(DOWN_S + SETTLE_S)  # the poller goes on, Cassandra stays up
                readings.append(_read(api, spell))
        finally:
            poller.stop()
        _write_report(readings, dict(poller.statuses))
        paired = list(itertools.pairwise(readings[WARM_OUTAGES:]))
        added = {s: sum(b.rss_mib - a.rss_mib for a, b in paired if b.spell == s) for s in ("outage", "quiet")}
        excess = added["outage"] - added["quiet"]
        assert excess <= EXCESS_MIB, f"{PAIRS} outages added {excess:.1f} MiB more than {PAIRS} quiet spells: {added}"
        # From the first reconnection on, threads and files stay put (9 and 31 per worker here). Sync endpoints run
        # on anyio's worker threads, which end after 10 s idle, and a request's socket may be open: 2 of slack, where
        # one leaked per reconnection would add 7.
        first, last = readings[1], readings[-1]
        assert last.threads <= first.threads + 2, f"threads after each spell: {[r.threads for r in readings]}"
        assert last.files <= first.files + 2, f"open files after each spell: {[r.files for r in readings]}"
    finally:
        control.down(settings)


def _write_report(readings: list[Reading], statuses: dict[str, int]) -> None:
    rows = "\n".join(
        f"| {k} | {r.spell} | {r.rss_mib:,.1f} | {r.rss_mib - readings[max(k - 1, 0)].rss_mib:+.1f} | {r.threads} | "
        f"{r.files} |"
        for k, r in enumerate(readings)
    )
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "api-outages.md").write_text(
        f"# The API's workers across Cassandra outages of {DOWN_S} s and quiet spells as long\n\n"
        "`trends serve --workers 2`, polled every 0.25 s with a connection per request; both workers together, at the "
        f"start and after each spell ({SETTLE_S} s after Cassandra accepted clients again, for an outage). "
        f"The first {WARM_OUTAGES} outages reach the high-water mark; the outages after them are judged against the "
        "quiet spells between them.\n\n"
        f"| # | spell | RSS (MiB) | step (MiB) | threads | open files |\n|---|---|---:|---:|---:|---:|\n{rows}\n\n"
        f"Answers: {statuses}.\n",
        encoding="utf-8",
    )
