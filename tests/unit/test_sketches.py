"""Python-side sketch reading and merging, with bounds (no Spark: sketches built with datasketches)."""

from __future__ import annotations

import math
import random

import datasketches as ds

from serving.queries import _upper_bounds
from views import sketches


def hll(users: list[str]) -> bytes:
    s = ds.hll_sketch(12, ds.tgt_hll_type.HLL_8)
    for u in users:
        s.update(u)
    return bytes(s.serialize_compact())


def test_users_union_is_exact_within_bounds() -> None:
    a = hll([f"u{i}" for i in range(0, 30_000)])
    b = hll([f"u{i}" for i in range(20_000, 50_000)])
    est = sketches.users([a, b], num_std_dev=3)
    assert est.lower <= 50_000 <= est.upper
    assert abs(est.value - 50_000) / 50_000 < 3 * sketches.HLL_RSE


def test_quantiles_merge_within_rank_error() -> None:
    rng = random.Random(1)
    values = [rng.random() * 1000 for _ in range(50_000)]
    parts = []
    for chunk in range(5):
        k = ds.kll_doubles_sketch(200)
        for v in values[chunk::5]:
            k.update(v)
        parts.append(bytes(k.serialize()))
    eps = sketches.kll_rank_error(parts)
    ordered = sorted(values)
    for q, got in zip([0.5, 0.99], sketches.quantiles(parts, [0.5, 0.99]), strict=True):
        assert got is not None
        rank = sum(v <= got for v in ordered) / len(ordered)
        assert abs(rank - q) <= eps
    assert sketches.quantiles([], [0.5]) == [None]


def test_top_items_bounds_hold() -> None:
    """The stated error is DataSketches' bound for the map size (3.5 / map slots of the total), and it holds."""
    truth = {f"#i{i}": 5000 // (i + 1) for i in range(3000)}
    halves = [ds.frequent_strings_sketch(10), ds.frequent_strings_sketch(10)]  # maps of 2**10 slots
    for i, (item, n) in enumerate(truth.items()):
        halves[i % 2].update(item, n // 2 if i % 3 else n)
        if i % 3:
            halves[(i + 1) % 2].update(item, n - n // 2)  # a third of the items are counted in one part only
    blobs = [bytes(h.serialize()) for h in halves]
    top, max_error = sketches.top_items(blobs, limit=10)
    assert max_error == math.ceil(3.5 / 2**10 * sum(truth.values()))  # 142 of 41,376
    assert [t.item for t in top[:3]] == ["#i0", "#i1", "#i2"]
    listed, _ = sketches.top_items(blobs, limit=len(truth))
    assert top == listed[:10]
    for t in listed:
        assert t.lower <= truth[t.item] <= t.upper
        assert abs(t.estimate - truth[t.item]) <= max_error and t.upper - t.lower <= max_error
    left_out = [n for item, n in truth.items() if item not in {t.item for t in listed}]
    assert left_out and max(left_out) <= max_error  # an item not listed counted at most the bound
    assert sketches.top_items([], limit=3) == ([], 0)


def test_a_row_by_row_union_keeps_every_bound() -> None:
    """Serving merges rows one at a time (SketchUnion.add): the union of 60 minute rows holds each sketch's bound."""
    rng = random.Random(7)
    union = sketches.SketchUnion()
    users_seen: set[str] = set()
    values: list[float] = []
    counts: dict[str, int] = {}
    for minute in range(60):
        h, k, f = ds.hll_sketch(12, ds.tgt_hll_type.HLL_8), ds.kll_doubles_sketch(200), ds.frequent_strings_sketch(10)
        for _ in range(800):
            # values drift minute by minute, so a row lost from the merge moves the quantiles
            user, value = f"u{rng.randrange(20_000)}", rng.expovariate(1 / (10 + 5 * minute))
            item = f"#i{min(int(rng.paretovariate(1.2)), 2000)}"
            h.update(user)
            k.update(value)
            f.update(item)
            users_seen.add(user)
            values.append(value)
            counts[item] = counts.get(item, 0) + 1
        # a minute whose read selected no items sketch carries an empty blob: skipped, not an error
        union.add(bytes(h.serialize_compact()), bytes(k.serialize()), bytes(f.serialize()) if minute % 7 else b"")
        if minute % 7 == 0:
            union.add_items(bytes(f.serialize()))
    est = union.users(num_std_dev=3)
    assert est.lower <= len(users_seen) <= est.upper
    ordered = sorted(values)
    for q, got in zip([0.1, 0.5, 0.99], union.quantiles([0.1, 0.5, 0.99]), strict=True):
        assert got is not None
        assert abs(sum(v <= got for v in ordered) / len(ordered) - q) <= union.rank_error()
    listed, max_error = union.top_items(limit=len(counts))
    assert max_error == math.ceil(3.5 / 2**10 * len(values))
    for t in listed:
        assert t.lower <= counts[t.item] <= t.upper
    assert all(n <= max_error for item, n in counts.items() if item not in {t.item for t in listed})
    # the free functions are the same merge: a list of blobs gives the same answer as the rows one by one
    hll_blob, kll_blob, _ = union.serialized()
    assert sketches.users([hll_blob], num_std_dev=3) == est
    assert sketches.quantiles([kll_blob], [0.5]) == union.quantiles([0.5])


def test_the_baselines_upper_bounds_read_at_once_equal_the_sketchs_own() -> None:
    """Trending reads the baseline's bounds of every item it tracks in one call: the same as asking item by item."""
    rng = random.Random(3)
    fi = ds.frequent_strings_sketch(4)  # 16 slots: most of 200 items are purged, the offset grows
    for _ in range(5000):
        fi.update(f"i{int(rng.paretovariate(1.1)) % 200}")
    upper = _upper_bounds(fi)
    for item in [f"i{i}" for i in range(200)] + ["never"]:
        assert upper(item) == fi.get_upper_bound(item), item
    assert _upper_bounds(None)("x") == 0
    assert _upper_bounds(ds.frequent_strings_sketch(4))("x") == 0
