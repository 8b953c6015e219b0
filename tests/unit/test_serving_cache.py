"""The serving caches' pure parts: the merged part of an answer, speed-minute keys, the answer LRU's accounting."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import datasketches as ds

from serving.answer_cache import Answer, AnswerCache, speed_key
from serving.merge import MergedPart
from views import sketches
from views.sketches import SketchUnion


def _row(rng: random.Random, events: int) -> tuple[bytes, bytes, bytes]:
    hll = ds.hll_sketch(12, ds.tgt_hll_type.HLL_8)
    kll = ds.kll_doubles_sketch(200)
    fi = ds.frequent_strings_sketch(6)
    for _ in range(events):
        hll.update(f"u{rng.randrange(300)}")
        kll.update(rng.random())
        fi.update(f"#i{rng.randrange(12)}")
    return bytes(hll.serialize_compact()), bytes(kll.serialize()), bytes(fi.serialize())


def test_a_part_merged_in_two_steps_answers_like_one_union() -> None:
    rng = random.Random(3)
    rows = [_row(rng, 50) for _ in range(12)]
    whole = sketches.SketchUnion()
    for r in rows:
        whole.add(*r)
    first = SketchUnion()
    for r in rows[:5]:
        first.add(*r)
    second = SketchUnion()
    second.add(*first.serialized())  # an answer's kept part, extended by the rows that came after
    for r in rows[5:]:
        second.add(*r)
    merged = sketches.SketchUnion()
    merged.add(*second.serialized())
    assert merged.users().value == whole.users().value  # HLL unions do not depend on the order
    assert whole.items is not None and merged.items is not None
    assert merged.items.total_weight == whole.items.total_weight == 12 * 50
    for item in ("#i0", "#i5", "#i11"):
        lo, hi = merged.items.get_lower_bound(item), merged.items.get_upper_bound(item)
        assert lo <= whole.items.get_estimate(item) <= hi


def test_an_empty_part_serializes_to_empty_blobs_that_merge_as_nothing() -> None:
    assert SketchUnion().serialized() == (b"", b"", b"")
    only_items = SketchUnion()
    only_items.add(b"", b"", _row(random.Random(1), 5)[2])
    hll, kll, fi = only_items.serialized()
    assert (hll, kll) == (b"", b"") and fi


def test_a_speed_minute_key_changes_with_its_count_and_epoch() -> None:
    m = datetime(2026, 1, 1, 10, 5, tzinfo=UTC)
    fields = frozenset({"items_fi"})
    assert speed_key("*", fields, "e1", m, 3) == speed_key("*", fields, "e1", m, 3)
    assert speed_key("*", fields, "e1", m, 3) != speed_key("*", fields, "e1", m, 4)
    assert speed_key("*", fields, "e1", m, 3) != speed_key("*", fields, "e2", m, 3)


def test_the_answer_cache_counts_outcomes_and_stays_within_its_bytes() -> None:
    cache = AnswerCache(max_bytes=1000)
    part = MergedPart(1, 1, {}, (b"", b"", b""), 0)
    for i in range(5):
        cache.put(("q", i), Answer((), (i,), [part], [], frozenset(), 0, 400, []))
    assert cache.bytes <= 1000 and len(cache) == 2  # the least recently used questions went
    assert cache.peek(("q", 4)) is not None and cache.peek(("q", 0)) is None
    assert (cache.hits, cache.misses) == (0, 0)  # peeking counts nothing
    for outcome in ("hit", "hit", "partial", "miss"):
        cache.count(outcome)
    assert (cache.hits, cache.partial, cache.misses) == (2, 1, 1)
    cache.put(("big",), Answer((), (), [part], [], frozenset(), 0, 5000, []))  # larger than the cache: not kept
    assert cache.peek(("big",)) is None


def test_a_reused_state_is_as_old_as_its_read_and_never_replaced_by_an_older_one() -> None:
    from serving.plan import Coverage
    from serving.reader import RecentStates

    def state(hour: int) -> Coverage:
        return Coverage(datetime(2026, 1, 1, hour, tzinfo=UTC), False, None, set(), set(), None, None)

    recent = RecentStates(limit=8)
    newer, older = state(2), state(1)
    recent.keep("w", 10.0, newer)
    recent.keep("w", 9.6, older)  # a slower read that began earlier ends later: the newer state stays
    assert recent.get("w", 0.25, 10.2) is newer
    assert recent.get("w", 0.25, 10.3) is None  # 0.3 s since its read began: read again
    assert recent.get("other", 0.25, 10.1) is None
    recent.keep("w", 10.4, older)
    assert recent.get("w", 0.25, 10.5) is older
    for i in range(10):  # bounded: a flood of windows drops what it holds rather than grow
        recent.keep(i, 11.0, newer)
    assert len(recent._states) <= 9
