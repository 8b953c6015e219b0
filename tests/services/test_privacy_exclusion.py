"""An erased subject left out of the views (exclusion mode) against real Kafka, Spark and Cassandra.

The erasure's recompute (the batch layer reads the erased subjects at every run) and purge (:mod:`batch_layer.
erasure`): the subject's hours equal a reference computed without its events, every other hour is left byte for byte,
no superseded version or speed row of those hours keeps the subject, and a restart, a new checkpoint or a rerun
never brings it back.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import datasketches as ds
import pytest

from batch_layer import erasure, job
from infra import migrations
from infra.cassandra import session, table
from infra.settings import Settings
from tests.helpers import produce_events, speed_drain
from views import sketches
from views.buckets import utc
from views.event import Event

pytestmark = [pytest.mark.spark, pytest.mark.privacy]

H0 = datetime(2025, 11, 23, 10, tzinfo=UTC)  # a year ago: closed hours
HOUR = timedelta(hours=1)
SUBJECT = "p_subjectXYZ0123456"  # the erased subject's pseudonym
SUBJECT_HOURS = (H0, H0 + 2 * HOUR)
HOURS = (H0, H0 + HOUR, H0 + 2 * HOUR)


def events_for(hour: datetime, n: int, subject_every: int | None) -> list[Event]:
    """``n`` events of the hour by 40 users; every ``subject_every``-th one by the subject instead."""
    return [
        Event(
            id=f"{hour:%H}-{i}",
            ts=hour + timedelta(seconds=(i * 37) % 3600),
            item=f"#i{i % 7}",
            user=SUBJECT if subject_every and i % subject_every == 0 else f"p_user{i % 40}",
            value=float(i % 17) + (1000.0 if subject_every and i % subject_every == 0 else 0.0),
            dims={"origin": "JFK" if i % 3 else "LAX"},
        )
        for i in range(n)
    ]


@dataclass
class Env:
    settings: Settings

    def rows(self, table_name: str, hour: datetime) -> dict[tuple[str, Any], Any]:
        """Return the hour's current batch rows (minutes or the hour) by (slice, bucket)."""
        with session(self.settings) as sess:
            runs = sess.execute(
                f"SELECT run_id FROM {table(self.settings, 'batch_intervals')} WHERE day = %s AND hour = %s",
                (hour.date(), hour),
            ).one()
            where = "hour = %s AND run_id = %s ALLOW FILTERING"
            rows = sess.execute(f"SELECT * FROM {table(self.settings, table_name)} WHERE {where}", (hour, runs.run_id))
            key = "bucket_start" if table_name in ("batch_minutes", "batch_tens") else "hour"
            return {(r.slice, utc(getattr(r, key))): r for r in rows}

    def versions(self, hour: datetime) -> set[uuid.UUID]:
        with session(self.settings) as sess:
            rows = sess.execute(
                f"SELECT run_id FROM {table(self.settings, 'batch_hours')} "
                "WHERE slice = '*' AND day = %s AND hour = %s",
                (hour.date(), hour),
            )
            return {r.run_id for r in rows}

    def speed_minutes(self, hour: datetime, table_name: str = "speed_minutes") -> list[Any]:
        """Return the speed view's rows of the hour (its minutes, or with ``speed_rollups`` its rollups)."""
        with session(self.settings) as sess:
            return list(
                sess.execute(
                    f"SELECT slice, bucket_start, events, users_hll FROM {table(self.settings, table_name)} "
                    "WHERE bucket_start >= %s AND bucket_start < %s ALLOW FILTERING",
                    (hour, hour + HOUR),
                )
            )

    def erase(self, pseudonym: str) -> None:
        with session(self.settings) as sess:
            sess.execute(
                f"INSERT INTO {table(self.settings, 'erased_pseudonyms')} (pseudonym, requested_at) VALUES (%s, %s)",
                (pseudonym, datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)),
            )


def _env(base: Settings, topic: str, keyspace: str) -> Env:
    settings = base.model_copy(
        update={
            "kafka": base.kafka.model_copy(update={"events_topic": topic}),
            "cassandra": base.cassandra.model_copy(update={"keyspace": keyspace}),
            "batch": base.batch.model_copy(update={"lateness_s": 600, "grace_s": 600}),
            "views": base.views.model_copy(update={"slice_dims": ["origin"]}),
        }
    )
    migrations.migrate(settings)
    return Env(settings)


@pytest.fixture
def envs(keyspace_settings: Settings, new_topic: Callable[..., str], stack_up: Settings) -> Iterator[tuple[Env, Env]]:
    """The pipeline with the subject, and a reference fed the same events without them (own topic and keyspace)."""
    from tests.helpers import drop_keyspace

    ref_keyspace = f"test_{uuid.uuid4().hex[:10]}"
    yield (
        _env(keyspace_settings, new_topic(partitions=3), keyspace_settings.cassandra.keyspace),
        _env(keyspace_settings, new_topic(partitions=3), ref_keyspace),
    )
    drop_keyspace(stack_up, ref_keyspace)


def member(blob: bytes, user: str) -> bool:
    """Tell whether a users' sketch holds ``user`` (small sketches: list or set mode, adding a member is a no-op)."""
    union = ds.hll_union(12)
    union.update(ds.hll_sketch.deserialize(blob))
    before = union.get_result().get_estimate()
    union.update(user)  # the same hash as Spark's hll_sketch_agg of the string
    return union.get_result().get_estimate() == before


def test_an_excluded_subject_leaves_exactly_its_hours_and_never_comes_back(
    envs: tuple[Env, Env], spark: Any, tmp_path: Path
) -> None:
    env, ref = envs
    subject_every = {H0: 9, H0 + HOUR: None, H0 + 2 * HOUR: 13}
    events = [e for h in HOURS for e in events_for(h, 400, subject_every[h])]
    closer = events_for(H0 + 4 * HOUR, 3, None)  # a later hour, left alone
    theirs = [e for e in events if e.user == SUBJECT]
    assert {e.ts.replace(minute=0, second=0, microsecond=0) for e in theirs} == set(SUBJECT_HOURS)
    produce_events(env.settings, [*events, *closer])
    produce_events(ref.settings, [*(e for e in events if e.user != SUBJECT), *closer])

    speed_drain(env.settings, tmp_path)  # before the batch layer: no watermark yet, the speed layer counts every hour
    job.run(env.settings, H0, H0 + 3 * HOUR, force=True, spark=spark)
    job.run(ref.settings, H0, H0 + 3 * HOUR, force=True, spark=spark)
    before = {h: env.rows("batch_hours", h) for h in HOURS}
    assert member(before[H0][("*", H0)].users_hll, SUBJECT)  # counted until the erasure
    assert any(member(r.users_hll, SUBJECT) for r in env.speed_minutes(H0) if r.slice == "*")
    assert any(member(r.users_hll, SUBJECT) for r in env.rows("batch_tens", H0).values())

    # The erasure in exclusion mode: the subject's pseudonym recorded, its hours recomputed, then purged.
    env.erase(SUBJECT)
    job.run(env.settings, hours=list(SUBJECT_HOURS), force=True, spark=spark)
    purged = erasure.purge(env.settings, SUBJECT_HOURS)
    assert purged.hours == 2 and purged.versions == 2 and purged.speed_slices >= 2 * 3

    for hour in HOURS:
        got, want = env.rows("batch_hours", hour), ref.rows("batch_hours", hour)
        if hour not in SUBJECT_HOURS:
            assert got == before[hour], "an hour without the subject was touched"
            continue
        assert set(got) == set(want)
        for key, row in got.items():
            ref_row = want[key]
            assert (
                row.events
                == ref_row.events
                == before[hour][key].events
                - sum(
                    1
                    for e in theirs
                    if e.ts >= hour and e.ts < hour + HOUR and key[0] in ("*", f"origin={e.dims['origin']}")
                )
            )
            assert not member(row.users_hll, SUBJECT)
            assert sketches.users([row.users_hll]) == sketches.users([ref_row.users_hll])
            assert sketches.quantiles([row.values_kll], [1.0]) == sketches.quantiles([ref_row.values_kll], [1.0])
        for finer in ("batch_minutes", "batch_tens"):
            rows = env.rows(finer, hour)
            assert rows.keys() == ref.rows(finer, hour).keys()
            assert not any(member(r.users_hll, SUBJECT) for r in rows.values())
        assert len(env.versions(hour)) == 1  # no superseded version keeps the subject for a rollback
        assert env.speed_minutes(hour) == []  # the speed rows of the hour are gone; the batch view serves it
        assert env.speed_minutes(hour, "speed_rollups") == []
    assert env.speed_minutes(H0 + HOUR) != []  # ...and only of those hours
    with session(env.settings) as sess:  # the day's rollup is merged again from the current hours
        days = list(sess.execute(f"SELECT users_hll FROM {table(env.settings, 'batch_days')}"))
    assert days and not any(member(r.users_hll, SUBJECT) for r in days)

    # No resurrection: a late event of the subject (pseudonymised before the erasure, produced after it), a rerun
    # of the range, the speed layer again on its checkpoint and on a new one.
    late = Event(id="late-1", ts=H0 + timedelta(minutes=5), item="#i1", user=SUBJECT, value=1.0, dims={})
    produce_events(env.settings, [late])
    job.run(env.settings, H0, H0 + 3 * HOUR, force=True, spark=spark)
    speed_drain(env.settings, tmp_path)
    speed_drain(env.settings, tmp_path / "new", **{"TRENDS_SPEED__FROM_WATERMARK": "false"})
    for hour in SUBJECT_HOURS:
        assert not any(member(r.users_hll, SUBJECT) for r in env.rows("batch_hours", hour).values())
        assert not any(member(r.users_hll, SUBJECT) for r in env.speed_minutes(hour))
        assert not any(member(r.users_hll, SUBJECT) for r in env.rows("batch_tens", hour).values())
        assert {k: r.events for k, r in env.rows("batch_hours", hour).items()} == {
            k: r.events for k, r in ref.rows("batch_hours", hour).items()
        }
