"""Blue/green view versions: promote's refusal rules, who is demoted, and serving's old-definition gaps (pure)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from infra.settings import Settings
from serving.plan import DEFINITION, NO_BATCH_RUN, NOT_DEFINED, SpeedCoverage, plan
from speed_layer.promote import ServingWatch, is_demoted, promote_problems, replaced
from views.buckets import HOUR, MINUTE
from views.definition import GLOBAL_SLICE, definition_of, fingerprint, slice_matcher
from views.store.definitions import ServingVersion
from views.store.speed import Epoch

T0 = datetime(2026, 5, 1, tzinfo=UTC)
BLUE = definition_of(["country"], 1024)
GREEN = definition_of(["country", "device"], 1024)
BIG = definition_of(["country"], 2048)
KNOWN = {fingerprint(d): d for d in (BLUE, GREEN, BIG)}
SERVING = ServingVersion("blue", fingerprint(BLUE))


def epoch(id_: str, covered_from: datetime | None, seen_until: datetime | None, definition: str | None) -> Epoch:
    """An epoch that has read the whole topic as far as its newest event (a query caught up with live traffic)."""
    return Epoch(id_, T0, covered_from, seen_until, definition=definition, read_all_at=seen_until)


# -- promote ----------------------------------------------------------------------------------------------------
def test_a_caught_up_green_from_the_watermark_is_promoted() -> None:
    blue = epoch("b", None, T0 + 5 * HOUR, fingerprint(BLUE))
    green = epoch("g", T0 + 3 * HOUR, T0 + 5 * HOUR + MINUTE, fingerprint(GREEN))
    assert promote_problems("green", SERVING, green, blue, boundary=T0 + 3 * HOUR) == []
    # a pin below the watermark: the boundary is the pin; green counting from the watermark's hour is then too late
    problems = promote_problems("green", SERVING, green, blue, boundary=T0 + 2 * HOUR)
    assert len(problems) == 1 and "after the batch boundary" in problems[0]


def test_a_green_behind_the_serving_query_is_refused_and_told_to_wait() -> None:
    blue = epoch("b", None, T0 + 5 * HOUR, fingerprint(BLUE))
    green = epoch("g", T0 + 3 * HOUR, T0 + 4 * HOUR, fingerprint(GREEN))
    (problem,) = promote_problems("green", SERVING, green, blue, boundary=T0 + 3 * HOUR)
    assert "has not caught up" in problem and "wait" in problem
    (problem,) = promote_problems("green", SERVING, epoch("g", T0 + 3 * HOUR, None, "x"), blue, T0 + 3 * HOUR)
    assert "has not caught up" in problem


def test_a_green_with_an_event_past_blue_but_not_the_whole_topic_is_refused() -> None:
    """Catching up from the watermark, green meets events past blue's before it has read everything up to them."""
    blue = epoch("b", None, T0 + 5 * HOUR, fingerprint(BLUE))
    catching = dataclasses.replace(epoch("g", T0 + 3 * HOUR, T0 + 5 * HOUR, fingerprint(GREEN)), read_all_at=None)
    (problem,) = promote_problems("green", SERVING, catching, blue, boundary=T0 + 3 * HOUR)
    assert "has not caught up" in problem and "the whole topic as of nothing" in problem
    behind = dataclasses.replace(catching, read_all_at=T0 + 5 * HOUR - timedelta(seconds=30))
    (problem,) = promote_problems("green", SERVING, behind, blue, boundary=T0 + 3 * HOUR)
    assert "has not caught up" in problem
    level = dataclasses.replace(catching, read_all_at=T0 + 5 * HOUR - timedelta(seconds=5))  # a trigger apart
    assert promote_problems("green", SERVING, level, blue, boundary=T0 + 3 * HOUR) == []


def test_a_green_without_an_epoch_a_definition_or_a_start_from_the_watermark_is_refused() -> None:
    blue = epoch("b", None, T0 + 5 * HOUR, fingerprint(BLUE))
    (problem,) = promote_problems("green", SERVING, None, blue, T0 + 3 * HOUR)
    assert "no speed epoch" in problem and "--from-watermark" in problem
    late = epoch("g", T0 + 4 * HOUR, T0 + 6 * HOUR, fingerprint(GREEN))  # started at latest, after the boundary
    (problem,) = promote_problems("green", SERVING, late, blue, T0 + 3 * HOUR)
    assert "counts minutes only from" in problem
    untracked = epoch("g", T0 + 3 * HOUR, T0 + 6 * HOUR, None)
    (problem,) = promote_problems("green", SERVING, untracked, blue, T0 + 3 * HOUR)
    assert "records no view definition" in problem
    assert promote_problems("blue", SERVING, blue, blue, T0 + 3 * HOUR) == ["blue already serves answers"]


def test_without_a_watermark_green_must_count_from_where_blue_does() -> None:
    blue = epoch("b", T0 + HOUR, T0 + 5 * HOUR, fingerprint(BLUE))
    assert promote_problems("green", SERVING, epoch("g", T0 + HOUR, T0 + 5 * HOUR, "x"), blue, None) == []
    (problem,) = promote_problems("green", SERVING, epoch("g", T0 + 2 * HOUR, T0 + 5 * HOUR, "x"), blue, None)
    assert "serving query blue" in problem


def test_only_a_query_that_served_during_its_run_is_demoted() -> None:
    after = ServingVersion("green", "g", previous_query="blue", previous_fingerprint="b", recorded=True)
    assert is_demoted("blue", after, served=True)
    assert not is_demoted("green", after, served=True)
    assert not is_demoted("red", after, served=False)  # a third query waiting for its promote keeps running
    assert not is_demoted("blue", after, served=False)  # blue started again after the promote: a standby (roll back)
    assert not is_demoted("blue", ServingVersion("blue", "b"), served=True)  # no promote yet
    assert replaced("blue", after) and not replaced("green", after) and not replaced("red", after)


def test_the_watch_demotes_a_standby_only_after_it_served(monkeypatch: pytest.MonkeyPatch) -> None:
    from speed_layer import promote

    now = {"serving": ServingVersion("blue", "b")}

    class Store:  # the serving row as DefinitionStore reads it
        def __init__(self, *_: object) -> None:
            pass

        def serving(self) -> ServingVersion:
            return now["serving"]

    monkeypatch.setattr(promote, "DefinitionStore", Store)
    settings = Settings()
    settings = settings.model_copy(update={"speed": settings.speed.model_copy(update={"query_name": "green"})})
    watch = ServingWatch(settings, every_s=0)
    watch.start(None)  # type: ignore[arg-type]
    assert watch.demoted_by(None) is None  # type: ignore[arg-type]  # green waits while blue serves
    now["serving"] = ServingVersion("green", "g", "blue", "b", recorded=True)
    assert watch.demoted_by(None) is None  # type: ignore[arg-type]  # promoted: green serves
    now["serving"] = ServingVersion("blue", "b", "green", "g", recorded=True)  # rolled back: green is demoted
    assert watch.demoted_by(None) == now["serving"]  # type: ignore[arg-type]


# -- serving: a batch hour of another definition is a gap for the slices it defines otherwise ------------------------
def servable(slice_: str, serving: dict[str, object] = GREEN):  # type: ignore[no-untyped-def]
    return slice_matcher(serving, fingerprint(serving), slice_, KNOWN.get)


def test_old_definition_hours_serve_the_slices_they_define_alike_only() -> None:
    blue_fp, green_fp, big_fp = fingerprint(BLUE), fingerprint(GREEN), fingerprint(BIG)
    mine, same = servable(GLOBAL_SLICE)
    assert mine is not None and same(blue_fp) and same(green_fp)
    assert not same(big_fp)  # another sketch size: not this slice's numbers
    _, same = servable("country=US")
    assert same(blue_fp) and same(green_fp)
    mine, same = servable("device=ios")
    assert mine is not None and same(green_fp) and not same(blue_fp)  # blue has no device slice
    assert not same("0123456789abcdef") and not same(None)  # unknown definitions are never served
    mine, same = servable("device=ios", BLUE)  # the serving definition itself lacks the slice
    assert mine is None and not same(fingerprint(BLUE))


def test_the_plan_answers_an_old_definition_hour_as_a_definition_gap_never_from_its_rows() -> None:
    hours = {T0 + h * HOUR for h in range(3)}
    _, same = servable("device=ios")
    defs = {T0: fingerprint(BLUE), T0 + HOUR: fingerprint(GREEN), T0 + 2 * HOUR: fingerprint(BLUE)}
    other = {h for h, fp in defs.items() if not same(fp)}
    spans = plan(T0, T0 + 3 * HOUR, T0 + 3 * HOUR, hours, set(), SpeedCoverage(()), "hour", other)
    assert [(s.start, s.layer, s.reason) for s in spans] == [
        (T0, "gap", DEFINITION),
        (T0 + HOUR, "batch", ""),
        (T0 + 2 * HOUR, "gap", DEFINITION),
    ]
    # the global slice is the same in both definitions: every hour is served
    _, same = servable(GLOBAL_SLICE)
    other = {h for h, fp in defs.items() if not same(fp)}
    assert other == set()
    # an hour without a run stays a gap of its own kind
    spans = plan(T0, T0 + 4 * HOUR, T0 + 4 * HOUR, hours, set(), SpeedCoverage(()), "hour", {T0})
    assert spans[0].reason == DEFINITION and spans[-1].reason == NO_BATCH_RUN


def test_no_daily_rollup_over_an_old_definition_hour() -> None:
    hours = {T0 + h * HOUR for h in range(24)}
    whole = plan(T0, T0 + timedelta(days=1), T0 + timedelta(days=1), hours, {T0.date()}, SpeedCoverage(()))
    assert [s.resolution for s in whole] == ["day"]
    spans = plan(T0, T0 + timedelta(days=1), T0 + timedelta(days=1), hours, {T0.date()}, SpeedCoverage(()),
                 "day", {T0 + 5 * HOUR})  # fmt: skip
    assert "day" not in {s.resolution for s in spans}
    assert [s.reason for s in spans if s.layer == "gap"] == [DEFINITION]


def test_speed_minutes_of_an_epoch_of_another_definition_are_gaps_not_zeros() -> None:
    e = epoch("b", T0, T0 + HOUR, fingerprint(BLUE))
    kept = {(T0, "b"): T0 + timedelta(days=9)}
    cov = SpeedCoverage((e,), kept, {}, T0 + HOUR, frozenset({"b"}))
    spans = plan(T0, T0 + HOUR, None, set(), set(), cov)
    assert [(s.layer, s.reason) for s in spans] == [("gap", NOT_DEFINED)]
    served = plan(T0, T0 + HOUR, None, set(), set(), SpeedCoverage((e,), kept, {}, T0 + HOUR))
    assert [s.layer for s in served] == ["speed"]
