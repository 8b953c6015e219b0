"""The serving row cache is used only where a read sees every acknowledged write, across data centres too."""

from __future__ import annotations

from typing import Any

import pytest

from infra.settings import Settings
from serving.reader import reads_see_acknowledged_writes, rows_cacheable

TWO_DCS: dict[str, Any] = {
    "replication_strategy": "NetworkTopologyStrategy",
    "datacenter_replication": {"dc1": 3, "dc2": 3},
}


def _cache(**cassandra: Any) -> bool:
    return rows_cacheable(Settings(cassandra=cassandra))


def test_one_data_centre_any_quorum_pair_or_a_single_replica() -> None:
    assert _cache(read_consistency="LOCAL_QUORUM", write_consistency="LOCAL_QUORUM", replication_factor=3)
    assert _cache(replication_strategy="NetworkTopologyStrategy", datacenter_replication={"dc1": 3})
    assert not _cache(read_consistency="ONE", write_consistency="LOCAL_QUORUM", replication_factor=3)
    assert _cache(read_consistency="ONE", write_consistency="ONE", replication_factor=1)


@pytest.mark.parametrize(
    ("read", "write", "cached"),
    [
        ("LOCAL_QUORUM", "LOCAL_QUORUM", False),  # a reader in dc2 may not see dc1's acknowledged run
        ("LOCAL_QUORUM", "QUORUM", False),  # 4 of 6 replicas may be 3 in dc1 and 1 in dc2
        ("QUORUM", "LOCAL_QUORUM", False),
        ("LOCAL_QUORUM", "EACH_QUORUM", True),  # every data centre holds a quorum of the write
        ("LOCAL_QUORUM", "ALL", True),
        ("QUORUM", "QUORUM", True),  # global quorums overlap
        ("ALL", "LOCAL_QUORUM", True),
        ("LOCAL_ONE", "EACH_QUORUM", False),
    ],
)
def test_across_data_centres_only_overlapping_levels(read: str, write: str, cached: bool) -> None:
    assert _cache(**TWO_DCS, read_consistency=read, write_consistency=write) is cached


def test_the_reason_names_the_levels_and_the_data_centres() -> None:
    ok, why = reads_see_acknowledged_writes(Settings(cassandra=TWO_DCS).cassandra)
    assert not ok and why == "LOCAL_QUORUM reads and LOCAL_QUORUM writes across 2 data centres (dc1, dc2)"


def test_cache_mb_0_turns_it_off_everywhere() -> None:
    assert not rows_cacheable(Settings(cassandra={"replication_factor": 1}, serving={"cache_mb": 0}))
