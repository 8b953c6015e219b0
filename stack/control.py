"""The local stack: which servers there are, and ``up``/``down``/``status``/``reset`` over them.

Kafka and Cassandra run by default, one node each or a small cluster (:mod:`stack.services`); Airflow
(:mod:`stack.airflow.service`), the pipeline's background commands and a Spark cluster join when named. They all keep
the :class:`~stack.services.base.StackService` contract, so these functions treat them alike.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from infra.errors import StackError
from infra.privacy.subjects import ensure_key_file
from infra.settings import Settings
from stack.airflow.service import Airflow
from stack.services.base import Service, ServiceStatus, StackService, find_java
from stack.services.cassandra import Cassandra
from stack.services.kafka import Kafka
from stack.services.pipeline import ApiService, BridgeService, SpeedService
from stack.services.prometheus import BatchExporterService, PrometheusService
from stack.services.registry import Registry
from stack.services.spark import SparkMaster, SparkWorker

logger = logging.getLogger(__name__)

# What `up` starts when no server is named; tests and `make demo` rely on it being just these two.
# The servers `up` starts by default: one node or a local cluster each, by the number of addresses configured.
SERVICES = ("kafka", "cassandra")
# Started only when named (`trends stack up airflow speed api`, `--with-airflow`, `trends demo`); `down` and `status`
# cover them too.
SPARK_WORKERS = 2  # spark-worker-1 … -N, on consecutive web UI ports
SPARK_CLUSTER = ("spark-master", *(f"spark-worker-{i}" for i in range(1, SPARK_WORKERS + 1)))
OPTIONAL_SERVICES = ("registry", "airflow", "speed", "bridge", "api", *SPARK_CLUSTER, "batch-exporter", "prometheus")
ALL_SERVICES = (*SERVICES, *OPTIONAL_SERVICES)


def nodes(settings: Settings, group: str) -> list[Service]:
    """Return the nodes of Kafka or Cassandra: one per configured address."""
    if group == "kafka":
        return [Kafka(settings, i) for i in range(len(settings.kafka.brokers))]
    return [Cassandra(settings, i) for i in range(len(settings.cassandra.contact_points))]


def services(settings: Settings, names: Sequence[str] | None = None) -> list[StackService]:
    """Return the stack's servers: the named ones (in stack order), else Kafka and Cassandra.

    ``kafka`` and ``cassandra`` name all nodes of a local cluster; ``kafka-2`` or ``cassandra-1`` name one.
    """
    chosen = list(names) if names else list(SERVICES)
    node_names = {n.name: n for group in SERVICES for n in nodes(settings, group)}
    unknown = [n for n in chosen if n not in ALL_SERVICES and n not in node_names]
    if unknown:
        known = ", ".join(dict.fromkeys([*node_names, *ALL_SERVICES]))
        msg = f"unknown service(s) {', '.join(unknown)}; choose from {known}"
        raise StackError(msg)
    picked: list[StackService] = [
        node for group in SERVICES for node in nodes(settings, group) if group in chosen or node.name in chosen
    ]
    factories: dict[str, Callable[[Settings], StackService]] = {
        "registry": Registry,
        "airflow": Airflow,
        "speed": SpeedService,
        "bridge": BridgeService,
        "api": ApiService,
        "batch-exporter": BatchExporterService,
        "prometheus": PrometheusService,
        "spark-master": SparkMaster,
        **{f"spark-worker-{i}": partial(SparkWorker, index=i) for i in range(1, SPARK_WORKERS + 1)},
    }
    return [*picked, *(factories[n](settings) for n in OPTIONAL_SERVICES if n in chosen)]


@dataclass(frozen=True)
class UpResult:
    """What ``up`` did for one server."""

    name: str
    address: str
    pid: int
    already_running: bool
    seconds: float


def up(settings: Settings, names: Sequence[str] | None = None) -> list[UpResult]:
    """Start the servers that are not running (all launched first, then awaited) and wait until each is ready.

    A second call while they run is a no-op. Data survives ``down``/``up``. The stack's subject key (the secret
    its producers key the hash of user ids with) is created with the stack's data, as every stack's producers need it.
    """
    chosen = services(settings, names)
    for svc in chosen:  # refuse an unsafe configuration before anything is launched
        if svc.pid() is None:
            svc.check_safe()
    if settings.privacy.pseudonymise and ensure_key_file(settings.subject_key_path):
        logger.info("created the subject key %s (mode 0600)", settings.subject_key_path)
    java = find_java(settings) if any(svc.needs_java and svc.pid() is None for svc in chosen) else ""
    launched: list[tuple[StackService, int, bool, float]] = []
    try:
        for svc in chosen:
            before = svc.pid()
            t0 = time.monotonic()
            pid = before if before is not None else svc.start(java)
            launched.append((svc, pid, before is not None, t0))
        results = []
        for svc, pid, already, t0 in launched:
            svc.wait_ready(pid)
            results.append(UpResult(svc.name, svc.address, pid, already, time.monotonic() - t0))
    except BaseException:
        for svc, _pid, already, _t0 in launched:  # don't leave half a stack we just started
            if not already:
                svc.stop()
        raise
    return results


def down(settings: Settings, names: Sequence[str] | None = None) -> list[str]:
    """Stop the servers this stack started (by pid file), Airflow first; return the names that were running.

    With no names it stops every server of the stack, Airflow included when it runs.
    """
    chosen = list(reversed(services(settings, names or ALL_SERVICES)))
    brokers = [svc for svc in chosen if isinstance(svc, Kafka)]
    stopped: list[str] = []
    for svc in chosen:
        if not isinstance(svc, Kafka):
            if svc.stop():
                stopped.append(svc.name)
        elif svc is brokers[0]:
            # The nodes of a Kafka cluster together: stopped one by one, the last ones lose their controller
            # quorum and hang in controlled shutdown until they are killed.
            with ThreadPoolExecutor(len(brokers)) as pool:
                ran = list(pool.map(lambda b: b.stop(), brokers))
            stopped += [b.name for b, r in zip(brokers, ran, strict=True) if r]
    return stopped


def status(settings: Settings, names: Sequence[str] | None = None) -> list[ServiceStatus]:
    """Return the state of each server (Kafka and Cassandra unless others are named)."""
    return [svc.status() for svc in services(settings, names)]


def reset(settings: Settings, names: Sequence[str] | None = None) -> list[Path]:
    """Stop the servers and delete their stored data (and, for a full reset, the streaming checkpoints).

    Airflow's metadata DB is deleted only when ``airflow`` is named.
    """
    chosen = services(settings, names)
    for svc in chosen:
        svc.stop()
    removed = []
    paths = [p for svc in chosen for p in svc.data_paths()]
    if not names or set(SERVICES) <= set(names):
        paths.append(Path(settings.checkpoint_root))
    for path in paths:
        if path.exists():
            shutil.rmtree(path)
            removed.append(path)
    return removed
