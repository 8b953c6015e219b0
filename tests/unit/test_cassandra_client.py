"""The driver's cluster as every layer builds it: how soon it comes back to a node it lost."""

from __future__ import annotations

import itertools

from infra.cassandra import make_cluster
from infra.settings import Settings


def test_reconnection_waits_at_most_the_setting_not_the_drivers_ten_minutes() -> None:
    cluster = make_cluster(Settings(cassandra={"reconnect_max_s": 12}))
    delays = list(itertools.islice(cluster.reconnection_policy.new_schedule(), 30))
    assert delays[0] <= 2  # the first retry comes quickly
    assert max(delays) <= 12 * 1.2  # the driver may add up to 15 % jitter, never more than the cap
    assert max(delays) >= 8  # and it does back off


def test_the_default_cap_is_half_a_minute() -> None:
    delays = list(itertools.islice(make_cluster(Settings()).reconnection_policy.new_schedule(), 40))
    assert 20 <= max(delays) <= 36
