"""The speed query's look at the erased subjects: when it looks, and what it answers (no services)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from infra.settings import Settings
from speed_layer.exclusions import ExclusionWatch


class _Rows:
    """A session whose erased-subjects table holds ``pseudonyms`` (or fails when it is None)."""

    def __init__(self, pseudonyms: list[str] | None) -> None:
        self.pseudonyms = pseudonyms
        self.reads = 0

    def execute(self, _query: str, **_kwargs: Any) -> list[SimpleNamespace]:
        self.reads += 1
        if self.pseudonyms is None:
            msg = "no host available"
            raise OSError(msg)
        return [SimpleNamespace(pseudonym=p) for p in self.pseudonyms]


def test_a_new_exclusion_is_seen_once_at_the_next_look_and_not_before() -> None:
    watch = ExclusionWatch(Settings(), 10.0, frozenset({"p_a"}))
    sess = _Rows(["p_a"])
    t0 = watch._next
    assert watch.changed(sess, now=t0 - 1) is None and sess.reads == 0  # not time yet
    assert watch.changed(sess, now=t0) is None and sess.reads == 1  # same set: no restart
    sess.pseudonyms = ["p_a", "p_b"]
    assert watch.changed(sess, now=t0 + 5) is None and sess.reads == 1  # looks every 10 s
    assert watch.changed(sess, now=t0 + 10) == frozenset({"p_a", "p_b"})
    assert watch.current == frozenset({"p_a", "p_b"})
    assert watch.changed(sess, now=t0 + 20) is None  # the query now runs with it


def test_cassandra_unreachable_or_no_session_is_no_restart() -> None:
    watch = ExclusionWatch(Settings(), 1.0, frozenset())
    assert watch.changed(None, now=watch._next) is None
    assert watch.changed(_Rows(None), now=watch._next) is None
    assert watch.current == frozenset()
