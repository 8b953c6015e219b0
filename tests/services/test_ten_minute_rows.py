"""Ten-minute rows against real Cassandra: the same answers as the minutes, fewer rows, and never a gap hidden.

Speed: minutes are written with the speed layer's own sink into a private keyspace (no batch run: every minute is
the speed layer's), closed intervals merged with :meth:`SpeedViewSink.roll_up` as the job does once the Spark
watermark has passed them, and windows answered by the serving path with the rollups read and, as the reference, with
``serving.ten_minute_rows`` off (minutes only): counts equal and exact, users, quantiles and items equal or within
their bounds, across the intervals' edges. Then the cases where a rollup must not answer: a minute missing when the
interval was merged (a named gap, not a smaller count), a new epoch owning the minutes, a promoted view version, and
a run killed before it merged. Batch: hours loaded through the batch layer's load with their ten-minute rows (and, as
runs from before them, without) answer windows whose edges fall inside hours the same as from minutes.
"""

from __future__ import annotations

import random
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import datasketches as ds
import pytest

from infra import migrations
from infra.cassandra import session, table
from infra.settings import Settings
from serving import queries, window
from serving.plan import SPEED_ROWS_GONE
from serving.reader import ViewReader
from speed_layer.sink import SpeedViewSink
from speed_layer.start import StreamStart
from tests.helpers import drop_keyspace
from views import sketches
from views.buckets import DAY, HOUR, MINUTE, SPEED_ROLLUP, floor
from views.definition import view_definition
from views.store.definitions import DefinitionStore
from views.store.rows import ViewRow

LAST_MS = MINUTE - timedelta(milliseconds=1)


@dataclass
class Minute:
    """The events of one planted minute, kept to check answers against."""

    users: list[str]
    values: list[float]
    items: list[str]

    def row(self, m: datetime) -> ViewRow:
        hll = ds.hll_sketch(12, ds.tgt_hll_type.HLL_8)
        kll = ds.kll_doubles_sketch(200)
        fi = ds.frequent_strings_sketch(8)
        for u, v, i in zip(self.users, self.values, self.items, strict=True):
            hll.update(u)
            kll.update(v)
            fi.update(i)
        sk = (bytes(hll.serialize_compact()), bytes(kll.serialize()), bytes(fi.serialize()))
        return ViewRow("*", m, len(self.users), *sk, m, m + LAST_MS)


@dataclass
class Speed:
    """A private keyspace with the serving definition registered, and the truth of every minute planted."""

    settings: Settings
    h0: datetime
    definition: str
    rng: random.Random = field(default_factory=lambda: random.Random(31))
    truth: dict[datetime, Minute] = field(default_factory=dict)

    def minute(self, events: int) -> Minute:
        return Minute(
            [f"u{self.rng.randrange(400)}" for _ in range(events)],
            [self.rng.lognormvariate(2, 1) for _ in range(events)],
            [f"#t{min(int(self.rng.paretovariate(1.2)), 60)}" for _ in range(events)],
        )

    def sink(self, query: str | None = None, begin: StreamStart | None = None) -> SpeedViewSink:
        return SpeedViewSink(
            self.settings, query or self.settings.speed.query_name, 24 * 3600,
            epoch_id=f"epoch-{uuid.uuid4().hex[:8]}", begin=begin, definition=self.definition,
        )  # fmt: skip

    def write(self, sink: SpeedViewSink, minutes: dict[datetime, Minute], batch_id: int) -> None:
        sink.write_rows([mm.row(m) for m, mm in sorted(minutes.items())], batch_id)
        sink.read_all(datetime.now(UTC))  # as the job records after a batch that read the whole topic

    def reader(self, sess: object, rollups: bool = True) -> ViewReader:
        """A reader with every cache off (each answer reads), with or without the rollups."""
        off = {"cache_mb": 0, "answer_cache_mb": 0, "state_max_age_ms": 0, "ten_minute_rows": rollups}
        settings = self.settings.model_copy(update={"serving": self.settings.serving.model_copy(update=off)})
        return ViewReader(settings, sess)  # type: ignore[arg-type]

    def events(self, start: datetime, end: datetime) -> list[Minute]:
        return [mm for m, mm in self.truth.items() if start <= m < end]


def speed_in(keyspace: Settings, migrate: bool = True) -> Speed:
    """A speed query of its own (rows are kept per query) in the keyspace, from the topic's beginning."""
    speed = keyspace.speed.model_copy(
        update={"starting_offsets": "earliest", "query_name": f"q_{uuid.uuid4().hex[:8]}"}
    )
    settings = keyspace.model_copy(update={"speed": speed})
    if migrate:
        migrations.migrate(settings)
    with session(settings) as sess:
        fp = DefinitionStore(settings, sess).register(view_definition(settings), settings.speed.query_name)
    return Speed(settings, floor(datetime.now(UTC), HOUR) - 4 * HOUR, fp)


def migrated_keyspace(stack_up: Settings) -> Iterator[Settings]:
    """Yield the settings of a new keyspace, migrated once, and drop it afterwards (a module fixture's body)."""
    name = f"test_{uuid.uuid4().hex[:10]}"
    keyspace = stack_up.model_copy(update={"cassandra": stack_up.cassandra.model_copy(update={"keyspace": name})})
    migrations.migrate(keyspace)
    yield keyspace
    drop_keyspace(stack_up, name)


@pytest.fixture(scope="module")
def shared_keyspace(stack_up: Settings) -> Iterator[Settings]:
    """One keyspace for the module's tests (each writes a query of its own): migrations once."""
    yield from migrated_keyspace(stack_up)


@pytest.fixture
def speed(shared_keyspace: Settings) -> Speed:
    return speed_in(shared_keyspace, migrate=False)


@pytest.fixture(scope="module")
def own_keyspace(stack_up: Settings) -> Iterator[Settings]:
    """A keyspace for the tests that change what it serves (a promote, the batch watermark), each in its own hours."""
    yield from migrated_keyspace(stack_up)


def plant(sp: Speed, hours: int = 3, drop: datetime | None = None) -> SpeedViewSink:
    """Write ``hours`` of minutes from h0 (1-9 events each, some empty) in batches of 20 minutes, rolled up after."""
    sink = sp.sink()
    last = sp.h0 + (hours * 60 - 1) * MINUTE  # planted, with the minute to lose: the tests count on them
    minutes = {
        m: sp.minute(sp.rng.randrange(1, 10))
        for m in (sp.h0 + i * MINUTE for i in range(hours * 60))
        if m in (last, drop) or sp.rng.random() > 0.05
    }
    sp.truth.update(minutes)
    ordered = sorted(minutes)
    for b, i in enumerate(range(0, len(ordered), 20)):
        sp.write(sink, {m: minutes[m] for m in ordered[i : i + 20]}, b)
    if drop is not None:  # a minute row lost before its interval was merged
        with session(sp.settings) as sess:
            sess.execute(
                f"DELETE FROM {table(sp.settings, 'speed_minutes')} WHERE query = %s AND slice = '*' AND day = %s "
                "AND bucket_start = %s",
                (sp.settings.speed.query_name, drop.date(), drop),
            )
    return sink


def check(got: window.Window, want: list[Minute]) -> None:
    """The window counts every event planted, its users, quantiles and items within their bounds."""
    summary = queries.summary(got)
    assert summary.events == sum(len(m.users) for m in want)
    users = {u for m in want for u in m.users}
    est = got.merged.sketches.users(num_std_dev=3)
    assert est.lower <= len(users) <= est.upper
    values = sorted(v for m in want for v in m.values)
    eps = got.merged.sketches.rank_error()
    for q in (0.5, 0.9):
        value = got.merged.sketches.quantiles([q])[0]
        assert value is not None
        rank = sum(v <= value for v in values) / len(values)
        assert abs(rank - q) <= eps + 1 / len(values)
    counts = Counter(i for m in want for i in m.items)
    top, max_error = got.merged.sketches.top_items(100)
    listed = {t.item: t for t in top}
    for item, n in counts.items():
        assert (listed[item].lower <= n <= listed[item].upper) if item in listed else n <= max_error


def test_windows_from_rollups_equal_the_same_windows_from_minutes(speed: Speed) -> None:
    sp, h0 = speed, speed.h0
    sink = plant(sp)
    try:
        # the Spark watermark: the newest event (the last minute's last instant) less the allowed lateness; the
        # interval ending at 2:50 is not closed by it, and serving reads rollups only up to 2:49 (final_until)
        closed = h0 + 3 * HOUR - MINUTE + LAST_MS - 10 * MINUTE
        assert sink.roll_up(closed) == int((closed - h0) / SPEED_ROLLUP) == 16  # every interval has rows
        assert sink.roll_up(closed) == 0  # merged once
    finally:
        sink.close()
    with session(sp.settings) as sess:
        fast, slow = sp.reader(sess), sp.reader(sess, rollups=False)
        windows = [  # (start, end, whether its left edge is read from the edge of a closed interval)
            # edges inside intervals on both sides: the left one's interval merged (its edge: one row), the right one's
            # not surely merged yet (minutes)
            (h0 + 7 * MINUTE, h0 + 2 * HOUR + 43 * MINUTE, True),
            (h0, h0 + 2 * HOUR, False),  # whole intervals only
            (h0 + 10 * MINUTE, h0 + 20 * MINUTE, False),  # exactly one interval
            (h0 + 5 * MINUTE, h0 + 15 * MINUTE, False),  # no whole interval: minutes only
            (h0 + 2 * HOUR + 30 * MINUTE, h0 + 3 * HOUR, False),  # across the newest interval merged into the tail
        ]
        for start, end, left_edge in windows:
            a = window.load(sp.reader(sess), start, end, "*", keep_rows=False)
            b = window.load(slow, start, end, "*", keep_rows=False)
            assert not a.provenance.gaps and not b.provenance.gaps
            assert a.merged.events == b.merged.events
            assert a.merged.sketches.users().value == pytest.approx(b.merged.sketches.users().value)
            check(a, sp.events(start, end))
            check(b, sp.events(start, end))
            whole = [
                t for t in (floor(start + SPEED_ROLLUP - MINUTE, SPEED_ROLLUP) + i * SPEED_ROLLUP for i in range(30))
                if t + SPEED_ROLLUP <= min(end, closed)
            ]  # fmt: skip
            minutes = sum(1 for m in sp.truth if start <= m < end)
            merged = sum(1 for m in sp.truth if any(t <= m < t + SPEED_ROLLUP for t in whole))
            edge = sum(1 for m in sp.truth if start <= m < whole[0]) - 1 if left_edge else 0
            assert b.merged.rows == minutes
            assert a.merged.rows == minutes - merged + len(whole) - edge, (start, end)
        # a series by the minute never reads a rollup: its rows are minutes
        series = window.load(fast, h0, h0 + HOUR, "*", coarsest="minute", keep_rows=False)
        assert series.merged.rows == sum(1 for m in sp.truth if h0 <= m < h0 + HOUR)
        # the answer cache merges the rollups too: the same answer as the minutes, and again from the cache
        cached = ViewReader(sp.settings, sess)
        for _ in range(2):
            c = window.load(cached, h0 + 7 * MINUTE, h0 + 2 * HOUR + 43 * MINUTE, "*", keep_rows=False)
            check(c, sp.events(h0 + 7 * MINUTE, h0 + 2 * HOUR + 43 * MINUTE))


def test_a_minute_missing_when_its_interval_was_merged_is_a_gap_not_a_smaller_count(speed: Speed) -> None:
    sp, h0 = speed, speed.h0
    lost = h0 + 23 * MINUTE
    sink = plant(sp, hours=1, drop=lost)
    try:
        sink.roll_up(h0 + HOUR)
    finally:
        sink.close()
    with session(sp.settings) as sess:
        for reader in (sp.reader(sess), sp.reader(sess, rollups=False), ViewReader(sp.settings, sess)):
            got = window.load(reader, h0, h0 + HOUR, "*", keep_rows=False)
            gaps = got.provenance.gaps
            assert [(g["start"], g["end"], g["reason"]) for g in gaps] == [(lost, lost + MINUTE, SPEED_ROWS_GONE)]
            check(got, [mm for m, mm in sp.truth.items() if h0 <= m < h0 + HOUR and m != lost])


def test_the_edges_of_merged_intervals_answer_as_their_minutes_and_never_hide_a_lost_one(speed: Speed) -> None:
    """A window's edges inside merged intervals are one row each, equal to their minutes; an edge merged while one
    of its minutes was missing holds fewer events than counted there: its minutes are read, the lost one a gap."""
    sp, h0 = speed, speed.h0
    lost = h0 + 33 * MINUTE
    sink = plant(sp, hours=1, drop=lost)
    try:
        assert sink.roll_up(h0 + HOUR) == 6  # every interval and its edges (kept speed.edge_ttl_s)
    finally:
        sink.close()
    with session(sp.settings) as sess:
        fast, slow = sp.reader(sess), sp.reader(sess, rollups=False)
        start, end = h0 + 3 * MINUTE, h0 + 27 * MINUTE  # intervals merged up to 0:49 (fresh 1:00 less 11 minutes)
        a, b = (window.load(r, start, end, "*", keep_rows=False) for r in (fast, slow))
        assert not a.provenance.gaps and not b.provenance.gaps
        check(a, sp.events(start, end))
        assert a.merged.events == b.merged.events
        assert a.merged.sketches.users().value == pytest.approx(b.merged.sketches.users().value, rel=0.03)
        assert a.merged.rows == 3  # the suffix 0:03-0:10, the rollup 0:10-0:20, the prefix 0:20-0:27
        end = h0 + 37 * MINUTE  # the prefix 0:30-0:37 lacks the lost minute
        got = window.load(fast, start, end, "*", keep_rows=False)
        gaps = got.provenance.gaps
        assert [(g["start"], g["end"], g["reason"]) for g in gaps] == [(lost, lost + MINUTE, SPEED_ROWS_GONE)]
        check(got, [mm for m, mm in sp.truth.items() if start <= m < end and m != lost])


def test_a_new_epoch_answers_from_its_own_minutes_and_rollups(speed: Speed) -> None:
    """A lost checkpoint: a new epoch recounts from the batch watermark's hour; the old epoch's rollups are not its."""
    sp, h0 = speed, speed.h0
    old = plant(sp)
    try:
        old.roll_up(h0 + 3 * HOUR)
    finally:
        old.close()
    since = h0 + HOUR
    new = sp.sink(begin=StreamStart(sp.settings.kafka.events_topic, since, {0: 0}))
    recount = {m: sp.minute(sp.rng.randrange(1, 10)) for m in (since + i * MINUTE for i in range(120))}
    try:
        sp.write(new, recount, 0)
        sp.truth.update(recount)
        with session(sp.settings) as sess:  # before the new epoch merged anything: its minutes, not the old rollups
            got = window.load(sp.reader(sess), h0, h0 + 3 * HOUR, "*", keep_rows=False)
            assert not got.provenance.gaps
            check(got, sp.events(h0, h0 + 3 * HOUR))
            assert got.merged.rows == 6 + len(recount)  # the old epoch's first hour merged, the new one's minutes
        assert new.roll_up(h0 + 3 * HOUR) == 12
        with session(sp.settings) as sess:
            got = window.load(sp.reader(sess), h0, h0 + 3 * HOUR, "*", keep_rows=False)
            check(got, sp.events(h0, h0 + 3 * HOUR))
            # read as rollups, the newest intervals' too (nothing was counted after them): 6 + 12 intervals
            assert got.merged.rows == 6 + 12
    finally:
        new.close()


def test_a_promoted_view_version_answers_from_its_own_rollups(own_keyspace: Settings) -> None:
    sp = speed_in(own_keyspace, migrate=False)  # not the shared keyspace: a promote changes what a keyspace serves
    h0 = sp.h0
    first = plant(sp, hours=1)
    try:
        first.roll_up(h0 + HOUR)
    finally:
        first.close()
    query = f"{sp.settings.speed.query_name}_v2"
    second = sp.sink(query)
    recount = {h0 + i * MINUTE: sp.minute(sp.rng.randrange(1, 10)) for i in range(60)}  # its own numbers
    try:
        sp.write(second, recount, 0)
        assert second.roll_up(h0 + HOUR) == 6
    finally:
        second.close()
    with session(sp.settings) as sess:
        reader = sp.reader(sess)
        check(window.load(reader, h0, h0 + HOUR, "*", keep_rows=False), list(sp.truth.values()))
        store = DefinitionStore(sp.settings, sess)
        applied, now = store.promote(query, sp.definition, store.serving())
        assert applied and now.query == query
        got = window.load(reader, h0, h0 + HOUR, "*", keep_rows=False)
        assert got.merged.rows == 6  # its own intervals, each from its rollup
        check(got, list(recount.values()))


def test_the_rollup_bounds_hold_for_a_merged_interval(speed: Speed) -> None:
    """A rollup's sketches are the union of its minutes': read alone, the interval's bounds hold."""
    sp, h0 = speed, speed.h0
    sink = plant(sp, hours=1)
    try:
        sink.roll_up(h0 + HOUR)
    finally:
        sink.close()
    with session(sp.settings) as sess:
        rows = list(
            sess.execute(
                f"SELECT bucket_start, width_min, epoch, events, users_hll FROM {table(sp.settings, 'speed_rollups')} "
                "WHERE query = %s AND slice = '*' AND day = %s",
                (sp.settings.speed.query_name, h0.date()),
            )
        )
    assert [r.width_min for r in rows] == [10] * 6
    for r in rows:
        start = r.bucket_start.replace(tzinfo=UTC)
        want = sp.events(start, start + SPEED_ROLLUP)
        assert r.events == sum(len(m.users) for m in want)
        est = sketches.users([r.users_hll], num_std_dev=3)
        assert est.lower <= len({u for m in want for u in m.users}) <= est.upper


def test_open_intervals_answer_from_rollups_rewritten_after_each_batch(speed: Speed) -> None:
    """Live rollups: the intervals the Spark watermark has not passed answer from rollups equal to their minutes; a
    batch that changes a minute leaves its interval's rollup short of the coverage until rewritten, and the answer
    stays exact meanwhile (read from the minutes)."""
    sp, h0 = speed, speed.h0
    sink = plant(sp, hours=1)
    newest = h0 + 59 * MINUTE
    start, end = h0 + 7 * MINUTE, h0 + HOUR
    try:
        assert sink.roll_up(h0 + 30 * MINUTE) == 3  # closed by the job's watermark
        assert sink.roll_up_live() == 3  # the open ones, 0:30 to 1:00
        assert sink.roll_up_live() == 0  # nothing changed since
        with session(sp.settings) as sess:
            fast, slow = sp.reader(sess), sp.reader(sess, rollups=False)

            def answer() -> window.Window:
                a = window.load(fast, start, end, "*", keep_rows=False)
                b = window.load(slow, start, end, "*", keep_rows=False)
                assert not a.provenance.gaps and not b.provenance.gaps
                assert a.merged.events == b.merged.events
                check(a, sp.events(start, end))
                return a

            edge = 1  # 0:07-0:10, the edge of a closed interval
            assert answer().merged.rows == edge + 5  # then a rollup per interval to the end
            old, extra = sp.truth[newest], sp.minute(4)
            grown = Minute(old.users + extra.users, old.values + extra.values, old.items + extra.items)
            sp.write(sink, {newest: grown}, 100)  # a micro-batch adds to the newest minute, not merged yet
            sp.truth[newest] = grown
            last = sum(1 for m in sp.truth if h0 + 50 * MINUTE <= m < end)
            assert answer().merged.rows == edge + 4 + last  # the stale rollup's interval from its minutes
            assert sink.roll_up_live() == 1
            assert answer().merged.rows == edge + 5
    finally:
        sink.close()


def test_a_run_killed_before_merging_leaves_its_intervals_to_the_next_run_of_the_epoch(speed: Speed) -> None:
    """The to-do of merges is written before the rows: a restart on its checkpoint merges what the dead run wrote."""
    sp, h0 = speed, speed.h0
    dead = sp.sink()
    first = {h0 + i * MINUTE: sp.minute(3) for i in range(40)}
    sp.write(dead, first, 0)  # then killed: no roll-up, the sink's memory gone
    dead.close()
    again = sp.sink()
    again.epoch_id = dead.epoch_id  # the same checkpoint: Spark's query id
    later = {h0 + i * MINUTE: sp.minute(3) for i in range(40, 60)}
    try:
        sp.write(again, later, 1)
        sp.truth.update(first | later)
        assert again.roll_up(h0 + HOUR) == 6  # the dead run's four intervals and its own two
        assert again.roll_up(h0 + HOUR) == 0
    finally:
        again.close()
    with session(sp.settings) as sess:
        got = window.load(sp.reader(sess), h0, h0 + HOUR, "*", keep_rows=False)
        check(got, list(sp.truth.values()))
        assert got.merged.rows == 6  # every interval merged (the newest ones too: nothing counted after them)


def test_the_speed_coverage_is_read_with_the_state_once_the_boundary_is_known(
    speed: Speed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One round of state reads per answer (the speed coverage read ahead from the boundary read last), not two."""
    import serving.reader
    import views.store.speed

    sp, h0 = speed, speed.h0
    plant(sp, hours=1).close()
    rounds: list[int] = []
    real = serving.reader.read_many

    def counting(sess: object, requests: list[object]) -> list[list[object]]:
        rounds.append(len(requests))
        return real(sess, requests)  # type: ignore[arg-type]

    monkeypatch.setattr(serving.reader, "read_many", counting)
    monkeypatch.setattr(views.store.speed, "read_many", counting)
    with session(sp.settings) as sess:
        reader = sp.reader(sess)
        first = window.load(reader, h0, h0 + HOUR, "*", keep_rows=False)
        assert len(rounds) == 2  # the boundary unknown: the coverage after it
        rounds.clear()
        again = window.load(reader, h0 + 5 * MINUTE, h0 + HOUR, "*", keep_rows=False)
        assert len(rounds) == 1
        check(first, sp.events(h0, h0 + HOUR))
        check(again, sp.events(h0 + 5 * MINUTE, h0 + HOUR))


def plant_batch(sp: Speed, first: datetime, hours: int, tens: bool = True) -> None:
    """Write ``hours`` of batch runs from ``first`` through the batch layer's load, with ten-minute rows or not."""
    from batch_layer import load
    from batch_layer.compute import Computed
    from batch_layer.offsets import HourPlan, Plan
    from batch_layer.publish import BatchStore
    from views.store.index import OffsetSpan

    minutes = {first + i * MINUTE: sp.minute(sp.rng.randrange(1, 10)) for i in range(hours * 60)}
    sp.truth.update(minutes)
    rows = {m: mm.row(m) for m, mm in minutes.items()}
    plans, by_hour, by_ten, hour_rows, offset = [], {}, {}, {}, 0
    for h in (first + i * HOUR for i in range(hours)):
        mine = [rows[m] for m in sorted(rows) if h <= m < h + HOUR]
        n = sum(r.events for r in mine)
        plans.append(HourPlan(h, (OffsetSpan(0, offset, offset + n - 1, n),)))
        offset += n
        by_hour[h] = mine
        hour_rows[h] = [merged_row(h, mine)]
        by_ten[h] = [merged_row(t, [r for r in mine if t <= r.bucket_start < t + SPEED_ROLLUP])
                     for t in (h + i * SPEED_ROLLUP for i in range(6))]  # fmt: skip
    done = Computed(by_hour, hour_rows, {}, offset, Counter(), Counter(), by_ten if tens else {})
    with session(sp.settings) as sess:
        store = BatchStore(sp.settings, sess)
        plan = Plan(sp.settings.kafka.events_topic, tuple(plans), ())
        load.load(store, plan, done, force=True, code="test", definition=sp.definition)
        store.pointers.advance(sp.h0)


def merged_row(start: datetime, rows: list[ViewRow]) -> ViewRow:
    hll, kll, fi = sketches.merge_all((r.users_hll, r.values_kll, r.items_fi) for r in rows)
    return ViewRow("*", start, sum(r.events for r in rows), hll, kll, fi, rows[0].min_ts, rows[-1].max_ts)


def test_batch_windows_from_ten_minute_rows_equal_the_same_windows_from_minutes(own_keyspace: Settings) -> None:
    """Hours whose runs wrote ten-minute rows (the first two) and runs from before them (the next two)."""
    sp = speed_in(own_keyspace, migrate=False)  # the batch watermark is the keyspace's
    sp.h0 = h0 = sp.h0 - 30 * HOUR  # below the promote test's speed hours, whatever order they run in
    plant_batch(sp, h0, 2)
    plant_batch(sp, h0 + 2 * HOUR, 2, tens=False)
    tens = {h0, h0 + HOUR}
    with session(sp.settings) as sess:
        slow, cached = sp.reader(sess, rollups=False), ViewReader(sp.settings, sess)
        for start, end in [
            (h0 + 7 * MINUTE, h0 + HOUR + 43 * MINUTE),  # edges inside hours with ten-minute rows
            (h0 + 10 * MINUTE, h0 + 50 * MINUTE),  # whole ten minutes only
            (h0 + 5 * MINUTE, h0 + 15 * MINUTE),  # none whole
            (h0 + HOUR + 7 * MINUTE, h0 + 3 * HOUR + 43 * MINUTE),  # into hours without them: minutes there
        ]:
            a = window.load(sp.reader(sess), start, end, "*", keep_rows=False)
            b = window.load(slow, start, end, "*", keep_rows=False)
            c = window.load(cached, start, end, "*", keep_rows=False)
            for got in (a, b, c):
                assert not got.provenance.gaps
                check(got, sp.events(start, end))
            assert a.merged.sketches.users().value == pytest.approx(b.merged.sketches.users().value)
            assert b.merged.rows == batch_rows(start, end, set())
            assert a.merged.rows == batch_rows(start, end, tens)


def batch_rows(start: datetime, end: datetime, tens: set[datetime]) -> int:
    """Return the rows a batch window reads: an hourly row per whole hour, else ten-minute rows and minutes."""
    rows, t = 0, start
    while t < end:
        hour = floor(t, HOUR)
        stop = min(hour + HOUR, end)
        lo, hi = floor(t + SPEED_ROLLUP - MINUTE, SPEED_ROLLUP), floor(stop, SPEED_ROLLUP)
        if t == hour and stop == t + HOUR:
            rows += 1
        elif hour not in tens or hi <= lo:
            rows += int((stop - t) / MINUTE)
        else:
            rows += int((lo - t) / MINUTE) + int((hi - lo) / SPEED_ROLLUP) + int((stop - hi) / MINUTE)
        t = stop
    return rows


def test_batch_windows_from_day_parts_equal_the_same_windows_from_hours(own_keyspace: Settings) -> None:
    """A window across midnight reads the whole hours on each side from the day's parts; a rerun of an hour whose
    parts were not merged again (the batch layer's parts off for it) is read from its hours, exact."""
    sp = speed_in(own_keyspace, migrate=False)
    end = sp.h0 - 30 * HOUR  # just below the ten-minute test's hours: one contiguous batch watermark either way
    d = floor(end - 3 * HOUR, DAY)  # a midnight with 3 or more planted hours after it
    sp.h0 = start = d - 12 * HOUR
    plant_batch(sp, start, int((end - start) / HOUR))
    off = sp.settings.model_copy(update={"batch": sp.settings.batch.model_copy(update={"day_parts": False})})
    w = (d - 9 * HOUR - 23 * MINUTE, d + 2 * HOUR + 17 * MINUTE)
    tens = {start + i * HOUR for i in range(int((end - start) / HOUR))}
    with session(sp.settings) as sess:

        def answers() -> tuple[window.Window, window.Window]:
            a = window.load(sp.reader(sess), *w, "*", keep_rows=False)
            b = window.load(Speed(off, sp.h0, sp.definition).reader(sess), *w, "*", keep_rows=False)
            for got in (a, b):
                assert not got.provenance.gaps
                check(got, sp.events(*w))
            # the same users merged in other groups: the union's estimator may differ slightly (both within bounds)
            assert a.merged.sketches.users().value == pytest.approx(b.merged.sketches.users().value, rel=0.03)
            assert b.merged.rows == batch_rows(*w, tens)
            return a, b

        a, b = answers()
        assert a.merged.rows == b.merged.rows - 8 - 1  # 9 hours before midnight and 2 after: a part each
        hourly = window.load(sp.reader(sess), *w, "*", coarsest="hour", keep_rows=False)
        assert hourly.merged.rows == b.merged.rows  # a series by the hour never reads a part
        check(hourly, sp.events(*w))
    # an hour after midnight recomputed with other events, its day's parts left as they were
    sp.settings = off
    plant_batch(sp, d + HOUR, 1)
    sp.settings = off.model_copy(update={"batch": off.batch.model_copy(update={"day_parts": True})})
    with session(sp.settings) as sess:
        a, b = answers()
        assert a.merged.rows == b.merged.rows - 8  # the part after midnight names the old run: its hours read
