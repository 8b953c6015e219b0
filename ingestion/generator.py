"""A seeded synthetic event stream with Zipf popularity and planted trending bursts, its ground truth, and its run.

Items ``#t1 … #tN`` are drawn with Zipf popularity (``#t1`` the most popular), users likewise, values from a
log-normal (a latency in ms), and two dimensions (``country``, ``device``). A
:class:`~ingestion.generator_config.Burst` makes one item ``factor`` times as frequent from minute ``start_minute``
of the stream for ``duration_minutes`` minutes; the total rate stays the same. The ground truth (bursts with their
windows and actual counts) is written as JSON so tests and demos can check that the pipeline finds what was planted.
What to generate, and the live and historical clocks, are :mod:`ingestion.generator_config`'s.

The same seed and settings give the same items, users, values and dimensions (and, in historical mode, the same
times and ids), because numbers are drawn in fixed-size chunks from one seeded generator.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from itertools import repeat
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Final

import numpy as np

from ingestion.generator_config import HOUR_MS, GeneratorConfig, item_name
from views.event import EVENT_SCHEMA_VERSION, format_ts, ts_millis

if TYPE_CHECKING:
    from ingestion.pseudonyms import Pseudonymiser

logger = logging.getLogger(__name__)

CHUNK: Final = 4096  # numbers are drawn in chunks of this size, whatever the pacing (reproducibility)
# Unpaced chunks whose users are resolved together: the subject store's requests grow with the buckets a call
# touches (up to 256) rather than with its users, so fewer, larger calls cost it less per user.
RESOLVE_CHUNKS: Final = 32
GROUPS_AHEAD: Final = 2  # groups of chunks resolved while one is produced (~130k events each, in memory)
PACE_SLICE_S: Final = 0.02  # a paced stream releases events in slices of this many seconds
COUNTRIES: Final = ("US", "IN", "BR", "DE", "GB", "FR", "JP", "ID", "MX", "IT", "ES", "CA", "KR", "NG", "PL")
DEVICES: Final = ("android", "ios", "web")
DEVICE_WEIGHTS: Final = (0.5, 0.3, 0.2)
_MS_TEXT: Final = [f".{ms:03d}Z" for ms in range(1000)]  # the millisecond and zone of a timestamp's text


# The user indexes a group asked the store for, and the future of its answer (user -> pseudonym).
_Asked = tuple[list[int], "Future[dict[str, str]]"]


@dataclass
class Chunk:
    """A slice of the stream, ready to produce: normalized JSON values, keys and record timestamps."""

    values: list[bytes]
    keys: list[bytes | None]
    ts_ms: list[int]


@dataclass
class _Plan:
    """A chunk laid out but not yet written: its first index, times, drawn indexes and burst counts."""

    first: int
    ts: list[int]
    items: list[int]
    users: list[int]
    values: list[str]  # as written in the JSON
    dims: list[int]
    in_bursts: list[tuple[int, int]]  # per burst: events in its window, and of those the burst's item


@dataclass
class BurstTruth:
    """One planted burst as it really happened."""

    item: str
    rank: int
    factor: float
    start_minute: float
    duration_minutes: float
    window_start: str
    window_end: str
    base_probability: float
    expected_lift: float  # factor / (1 + (factor - 1) * p): the total rate is kept, so the lift is a bit lower
    events_in_window: int = 0  # events of the item inside the window
    all_events_in_window: int = 0  # events of any item inside the window


@dataclass
class GroundTruth:
    """What the generator did, written as JSON next to the stream."""

    seed: int
    mode: str
    start: str
    end: str
    count: int
    items: int
    zipf_s: float
    users: int
    first_event_id: str
    bursts: list[BurstTruth] = field(default_factory=list)

    def to_json(self) -> str:
        """Return the ground truth as indented JSON."""
        return json.dumps(asdict(self), indent=2)


def _zipf_cdf(n: int, s: float) -> np.ndarray[Any, np.dtype[np.float64]]:
    weights = np.arange(1, n + 1, dtype=np.float64) ** -s
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    return cdf


def _ranks(cdf: np.ndarray[Any, np.dtype[np.float64]], draws: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Return ``searchsorted(cdf, draws, side="right")``, searched in sorted order (half the cost on a large cdf)."""
    order = np.argsort(draws)
    ranks = np.empty(len(draws), dtype=np.int64)
    ranks[order] = np.searchsorted(cdf, draws[order], side="right")
    return ranks


def _value_texts(mu: float, sigma: float) -> np.ndarray[Any, np.dtype[np.object_]]:
    """Return the text of every two-decimal value up to 4 sigmas above the median, by its hundredths.

    Formatting a float costs more than the rest of an event's JSON, and the values repeat: the table is looked up.
    ``repr(c / 100)`` is the text of ``np.round(x, 2)`` for ``c = rint(x * 100)`` (numpy rounds that way).
    """
    top = min(int(math.exp(mu + 4 * sigma) * 100) + 1, 1_000_000)
    return np.asarray([repr(c / 100) for c in range(top)], dtype=object)


def _ts_texts(ts: list[int]) -> Iterable[str]:
    """Return the timestamps' text (``2025-01-01T00:00:00.000Z``), once for a chunk whose events share one."""
    if not ts:
        return []
    if ts.count(ts[0]) == len(ts):  # live: a chunk is stamped with the clock once
        t = ts[0]
        return repeat(datetime.fromtimestamp(t // 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S") + _MS_TEXT[t % 1000])
    heads = {sec: datetime.fromtimestamp(sec, UTC).strftime("%Y-%m-%dT%H:%M:%S") for sec in {t // 1000 for t in ts}}
    return [heads[t // 1000] + _MS_TEXT[t % 1000] for t in ts]


class _KnownUsers:
    """What a generator may reuse of its users' pseudonyms, by user index, without asking the store again.

    A user is known for the last hour recorded for it. The store's memory bounds how long a pseudonym may be
    trusted (``privacy.pseudonym_cache_ttl_s``); whatever was copied from it is dropped when it turns, so this
    never outlives it. Marks are set when a group is asked for, before its answer: groups are produced in order,
    and each only after its own answer, so a later group that relies on an earlier one's mark has it.
    """

    def __init__(self, users: int) -> None:
        self.hour = np.full(users, -1, dtype=np.int64)  # per user index: the hour (since the epoch) recorded
        self.names: list[str] = [""] * users  # per user index: its pseudonym, once answered
        self.turns: int | None = None  # the store's memory turns when the marks were set

    def ask(self, users: np.ndarray[Any, Any], ts: np.ndarray[Any, Any], turns: int | None) -> tuple[Any, Any]:
        """Return the (user index, hour) pairs to ask the store for, and mark them known."""
        if turns is None or turns != self.turns:
            self.hour.fill(-1)
            self.turns = turns
        hours = ts // HOUR_MS
        need = self.hour[users] != hours
        size = len(self.hour)
        pairs = np.unique(hours[need] * size + users[need])
        pair_users, pair_hours = pairs % size, pairs // size
        if turns is not None:  # no memory in the store: nothing is trusted past its batch
            self.hour[pair_users] = pair_hours  # sorted by hour: a user's last mark is its latest hour
        return pair_users, pair_hours


class SyntheticStream:
    """The generator: iterate :meth:`chunks`, then read :attr:`truth`.

    :arg pseudonymiser: replaces the users (``u1`` …) by their pseudonyms in the JSON and the keys, and records
        each chunk's subject hours, before the chunk is handed out (the stream then goes to the events topic).
    """

    def __init__(
        self,
        config: GeneratorConfig,
        *,
        clock: Callable[[], float] = time.time,
        pseudonymiser: Pseudonymiser | None = None,
    ) -> None:
        self.config = config
        self._pseudonymiser = pseudonymiser
        self._clock = clock
        self._rng = np.random.default_rng(config.seed)
        # A second stream for the bursts, so planting a burst leaves every other draw of the stream unchanged.
        self._burst_rng = np.random.default_rng([config.seed, 1])
        self._item_cdf = _zipf_cdf(config.items, config.zipf_s)
        self._user_cdf = _zipf_cdf(config.users, config.user_zipf_s)
        self._country_cdf = _zipf_cdf(len(COUNTRIES), 1.0)
        self._device_cdf = np.cumsum(DEVICE_WEIGHTS) / sum(DEVICE_WEIGHTS)
        # an event's item and the start of its user, written once per item
        self._item_json = [f'"item":{json.dumps(item_name(r))},"user":"' for r in range(1, config.items + 1)]
        self._value_texts = _value_texts(config.value_mu, config.value_sigma)
        self._item_keys = [item_name(r).encode() for r in range(1, config.items + 1)]
        self._user_names = [f"u{u}" for u in range(1, config.users + 1)]
        self._dims_json = [
            f'{{"country":"{c}","device":"{d}"}}' for c in COUNTRIES for d in DEVICES
        ]  # index: country * len(DEVICES) + device
        self._start_ms = ts_millis(config.start) if config.start is not None else int(self._clock() * 1000)
        self._id_prefix = f"g{config.seed}-{self._start_ms}-"
        probabilities = np.diff(self._item_cdf, prepend=0.0)
        self._bursts: list[tuple[int, int, int, float, BurstTruth]] = []
        for burst in config.bursts:
            rank = int(burst.item[2:])
            p = float(probabilities[rank - 1])
            lo = self._start_ms + round(burst.start_minute * 60_000)
            hi = lo + round(burst.duration_minutes * 60_000)
            q = (burst.factor - 1) * p / (1 + (burst.factor - 1) * p)  # P(override) so the item's share is k-fold
            truth = BurstTruth(
                item=burst.item,
                rank=rank,
                factor=burst.factor,
                start_minute=burst.start_minute,
                duration_minutes=burst.duration_minutes,
                window_start=format_ts(datetime.fromtimestamp(lo / 1000, UTC)),
                window_end=format_ts(datetime.fromtimestamp(hi / 1000, UTC)),
                base_probability=p,
                expected_lift=burst.factor / (1 + (burst.factor - 1) * p),
            )
            self._bursts.append((rank - 1, lo, hi, q, truth))
        self.emitted = 0
        self._last_ts = self._start_ms  # of the last chunk handed out
        self._planned_ts = self._start_ms  # of the last chunk laid out (ahead of it when pipelined)

    @property
    def start_ms(self) -> int:
        """Return the stream's first event time (epoch ms)."""
        return self._start_ms

    def _draw(self, n: int) -> dict[str, list[Any]]:
        """Draw the random parts of the next ``n`` events (always CHUNK-sized draws, sliced)."""
        rng = self._rng
        items = _ranks(self._item_cdf, rng.random(n)).tolist()
        burst = self._burst_rng.random((len(self._bursts), n))
        users = _ranks(self._user_cdf, rng.random(n)).tolist()
        hundredths = np.rint(rng.lognormal(self.config.value_mu, self.config.value_sigma, n) * 100).astype(np.int64)
        texts = self._value_texts
        values = texts[np.minimum(hundredths, len(texts) - 1)].tolist()
        for i in np.flatnonzero(hundredths >= len(texts)).tolist():  # beyond the table: rare
            values[i] = repr(int(hundredths[i]) / 100)
        return {
            "item": items,
            "burst": burst,
            "user": users,
            "value": values,
            "dims": (
                np.searchsorted(self._country_cdf, rng.random(n), side="right") * len(DEVICES)
                + np.searchsorted(self._device_cdf, rng.random(n), side="right")
            ).tolist(),
        }

    def _timestamps(self, first: int, n: int) -> np.ndarray[Any, np.dtype[np.int64]]:
        if self.config.historical:
            index = np.arange(first, first + n, dtype=np.int64)
            cycle = self.config.cycle
            if cycle is not None:
                return cycle.times(self._start_ms, index * 1000 / self.config.events_per_event_second)
            return self._start_ms + (index * 1000 / self.config.events_per_event_second).astype(np.int64)
        now = max(int(self._clock() * 1000), self._planned_ts)  # never backwards, even if the clock is
        self._planned_ts = now
        return np.full(n, now, dtype=np.int64)

    def chunks(self, sizes: Iterator[int] | None = None) -> Iterator[Chunk]:
        """Yield the stream in chunks (of at most :data:`CHUNK` events, or the sizes asked for, capped so).

        With a pseudonymiser and no pacing (``config.rate`` None), the users of :data:`RESOLVE_CHUNKS` chunks are
        resolved in one call, and :data:`GROUPS_AHEAD` such groups while a group is produced; each chunk is still
        handed out only once its pseudonyms and hours are durable.

        :arg sizes: how many events each next chunk should hold (pacing asks for small ones).
        """
        plans = self._plans(sizes)
        pseudonymiser = self._pseudonymiser
        if pseudonymiser is None:
            for plan in plans:
                yield self._render(plan, self._user_names)
            return
        if self.config.rate is not None:  # paced: each chunk's times are the clock when it is made
            for plan in plans:
                yield self._render(plan, self._pseudonymised(pseudonymiser, plan))
            return
        known = _KnownUsers(len(self._user_names))
        ahead: deque[tuple[list[_Plan], _Asked]] = deque()
        group: list[_Plan] = []
        for plan in plans:
            group.append(plan)
            if len(group) < RESOLVE_CHUNKS:
                continue
            ahead.append((group, self._resolve_async(pseudonymiser, group, known)))
            group = []
            if len(ahead) > GROUPS_AHEAD:
                yield from self._render_resolved(*ahead.popleft(), known)
        if group:
            ahead.append((group, self._resolve_async(pseudonymiser, group, known)))
        while ahead:
            yield from self._render_resolved(*ahead.popleft(), known)

    def _resolve_async(self, pseudonymiser: Pseudonymiser, group: list[_Plan], known: _KnownUsers) -> _Asked:
        """Ask the store for the group's (user, hour) pairs that ``known`` does not hold yet."""
        users = np.concatenate([np.asarray(plan.users, dtype=np.int64) for plan in group])
        ts = np.concatenate([np.asarray(plan.ts, dtype=np.int64) for plan in group])
        pair_users, pair_hours = known.ask(users, ts, pseudonymiser.memory_turns())
        names = self._user_names
        asked = np.unique(pair_users).tolist()
        hours = [(names[u], h * HOUR_MS) for u, h in zip(pair_users.tolist(), pair_hours.tolist(), strict=True)]
        return asked, pseudonymiser.table_async([names[u] for u in asked], hours)

    def _render_resolved(self, group: list[_Plan], asked: _Asked, known: _KnownUsers) -> Iterator[Chunk]:
        users, table = asked
        found = table.result()
        names, pseudonyms = self._user_names, known.names
        for u in users:
            pseudonyms[u] = found[names[u]]
        for plan in group:
            yield self._render(plan, pseudonyms)

    def _plans(self, sizes: Iterator[int] | None) -> Iterator[_Plan]:
        total = self.config.total()
        drawn: dict[str, Any] | None = None
        used = 0
        planned = self.emitted
        while total is None or planned < total:
            want = next(sizes) if sizes is not None else CHUNK
            if drawn is None or used >= CHUNK:
                drawn, used = self._draw(CHUNK), 0
            n = min(want, CHUNK - used, (total - planned) if total is not None else CHUNK)
            plan = self._plan(drawn, used, n, planned)
            planned += n
            yield plan
            used += n

    def _plan(self, drawn: dict[str, Any], offset: int, n: int, first: int) -> _Plan:
        """Lay out the next ``n`` events (times, items with the bursts planted, users, values, dims)."""
        ts = self._timestamps(first, n)
        items = drawn["item"][offset : offset + n]
        in_bursts: list[tuple[int, int]] = []
        for row, (idx, lo, hi, q, _truth) in enumerate(self._bursts):
            in_window = (ts >= lo) & (ts < hi)
            if not in_window.any():
                in_bursts.append((0, 0))
                continue
            chosen = in_window & (drawn["burst"][row][offset : offset + n] < q)
            items = np.where(chosen, idx, np.asarray(items)).tolist()
            in_bursts.append((int(in_window.sum()), int((in_window & (np.asarray(items) == idx)).sum())))
        return _Plan(
            first=first,
            ts=ts.tolist(),
            items=items,
            users=drawn["user"][offset : offset + n],
            values=drawn["value"][offset : offset + n],
            dims=drawn["dims"][offset : offset + n],
            in_bursts=in_bursts,
        )

    def _render(self, plan: _Plan, user_names: list[str] | dict[int, str]) -> Chunk:
        """Write a planned chunk's JSON, keys and timestamps with these user names; count it as emitted."""
        first, ts_list, items, users, values, dims = plan.first, plan.ts, plan.items, plan.users, plan.values, plan.dims
        n = len(ts_list)
        for (_idx, _lo, _hi, _q, truth), (in_window, hits) in zip(self._bursts, plan.in_bursts, strict=True):
            truth.all_events_in_window += in_window
            truth.events_in_window += hits
        item_json, dims_json, prefix = self._item_json, self._dims_json, self._id_prefix
        head = f'{{"v":{EVENT_SCHEMA_VERSION},"id":"{prefix}'
        out = [
            f'{head}{i}","ts":"{ts}",{item_json[item]}{user_names[user]}","value":{value},"dims":{dims_json[dim]}}}'.encode()
            for i, ts, item, user, value, dim in zip(
                range(first, first + n), _ts_texts(ts_list), items, users, values, dims, strict=False
            )
        ]
        keys: list[bytes | None]
        key_field = self.config.key_field
        if key_field == "item":
            item_keys = self._item_keys
            keys = [item_keys[i] for i in items]
        elif key_field == "user":
            keys = [user_names[u].encode() for u in users]
        elif key_field == "id":
            keys = [f"{prefix}{first + i}".encode() for i in range(n)]
        else:
            keys = [None] * n
        self.emitted = first + n
        if ts_list:
            self._last_ts = ts_list[-1]
        return Chunk(out, keys, ts_list)

    def _pseudonymised(self, pseudonymiser: Pseudonymiser, plan: _Plan) -> dict[int, str]:
        """Return user index -> pseudonym for a chunk's users, after recording their hours."""
        names = self._user_names
        distinct = list(set(plan.users))
        users = [names[u] for u in plan.users]
        table = pseudonymiser.table([names[u] for u in distinct], zip(users, plan.ts, strict=True))
        return {u: table[names[u]] for u in distinct}

    def truth(self) -> GroundTruth:
        """Return the ground truth of what has been generated so far."""
        last = self._last_ts
        return GroundTruth(
            seed=self.config.seed,
            mode="historical" if self.config.historical else "live",
            start=format_ts(datetime.fromtimestamp(self._start_ms / 1000, UTC)),
            end=format_ts(datetime.fromtimestamp(last / 1000, UTC)),
            count=self.emitted,
            items=self.config.items,
            zipf_s=self.config.zipf_s,
            users=self.config.users,
            first_event_id=f"{self._id_prefix}0",
            bursts=[b[4] for b in self._bursts],
        )


@dataclass
class RunStats:
    """How a generator run went (the producer's summary has the delivery side)."""

    emitted: int = 0
    elapsed_s: float = 0.0
    stopped: bool = False


def run(
    stream: SyntheticStream,
    emit: Callable[[Chunk], None],
    *,
    rate: float | None,
    duration_s: float | None = None,
    wait: Callable[[float], None] = time.sleep,
    should_stop: Callable[[], bool] = lambda: False,
    on_progress: Callable[[RunStats], None] | None = None,
    progress_interval_s: float = 2.0,
) -> RunStats:
    """Drive a stream into ``emit`` (a producer or a file), paced at ``rate`` events/s or as fast as possible.

    :arg duration_s: stop after this many wall-clock seconds (live streams).
    :arg wait: how to pass time while pacing (a producer's ``poll`` keeps serving delivery reports).
    :arg should_stop: checked between chunks; true stops the run (Ctrl-C).
    """
    stats = RunStats()
    t0 = time.monotonic()
    last_progress = t0
    slice_size = max(1, min(CHUNK, math.ceil(rate * PACE_SLICE_S))) if rate else CHUNK

    def sizes() -> Iterator[int]:
        while True:
            yield slice_size

    for chunk in stream.chunks(sizes()):
        emit(chunk)
        stats.emitted += len(chunk.values)
        now = time.monotonic()
        if on_progress is not None and now - last_progress >= progress_interval_s:
            last_progress = now
            stats.elapsed_s = now - t0
            on_progress(stats)
        if should_stop():
            stats.stopped = True
            break
        if duration_s is not None and now - t0 >= duration_s:
            break
        if rate:
            due = t0 + stats.emitted / rate
            while (delay := due - time.monotonic()) > 0 and not should_stop():
                wait(min(delay, 0.2))
    stats.elapsed_s = time.monotonic() - t0
    if on_progress is not None:
        on_progress(stats)
    return stats


def write_truth(stream: SyntheticStream, path: Path) -> None:
    """Write the stream's ground truth as JSON (atomically: a reader never sees half a file)."""
    tmp = path.with_name(path.name + ".tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp.write_text(stream.truth().to_json() + "\n")
    tmp.replace(path)


def jsonl_writer(out: BinaryIO) -> Callable[[Chunk], None]:
    """Return an ``emit`` that writes chunks as JSON lines to a binary stream."""

    def emit(chunk: Chunk) -> None:
        out.write(b"\n".join(chunk.values) + b"\n")

    return emit
