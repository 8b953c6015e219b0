"""Python-side sketch reading and merging, with bounds (no Spark: sketches built with datasketches)."""

from __future__ import annotations

import random

import datasketches as ds

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
    sk = ds.frequent_strings_sketch(10)  # 1024 slots
    truth = {f"#i{i}": 5000 // (i + 1) for i in range(3000)}
    for item, n in truth.items():
        sk.update(item, n)
    top, max_error = sketches.top_items([bytes(sk.serialize())], limit=10)
    assert [t.item for t in top[:3]] == ["#i0", "#i1", "#i2"]
    for t in top:
        assert t.lower <= truth[t.item] <= t.upper
    assert max_error >= 0
    assert sketches.top_items([], limit=3) == ([], 0)
