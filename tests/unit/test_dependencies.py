"""Every third-party package the code imports is declared, in the install that needs it.

`pip install .` is the pipeline without Airflow: a module of the pipeline that imported an undeclared package
(or Airflow) would work in the dev venv, where something else pulled the package in, and fail in a deployment.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from functools import cache
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = ["app", "stack", "infra", "ingestion", "speed_layer", "batch_layer", "views", "serving", "privacy"]
# The project's own top-level names; bench scripts import each other (bench/ is on their path).
FIRST_PARTY = {*PIPELINE, "dags", "tests", "bench", *(p.stem for p in (ROOT / "bench").glob("*.py"))}
# Declared for a use that is not an import statement.
NOT_IMPORTED = {
    "pyarrow": "DataFrame.toArrow (batch_layer.compute) needs it; pyspark declares it only in its [sql] extra",
}


def _project() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]  # type: ignore[no-any-return]


def _name(requirement: str) -> str:
    """Return the normalized distribution name of a requirement string."""
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    assert match is not None, requirement
    return re.sub(r"[-_.]+", "-", match.group(0)).lower()


def _declared(*extras: str) -> set[str]:
    project = _project()
    names = {_name(r) for r in project["dependencies"]}  # type: ignore[attr-defined]
    optional: dict[str, list[str]] = project["optional-dependencies"]  # type: ignore[assignment]
    for extra in extras:
        names |= {_name(r) for r in optional[extra] if not r.startswith("trends[")}
    return names


PEERS = ROOT / "bench" / "peers"  # `make bench-peers`: Flink and quixstreams in a venv of their own


@cache
def _parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


@cache
def _packages() -> dict[str, list[str]]:
    """Return top-level module -> distributions (a scan of every installed distribution: done once)."""
    return dict(metadata.packages_distributions())


def _imports(folders: list[str], skip: Path | None = None) -> dict[str, set[str]]:
    """Return top-level module name -> files importing it (absolute imports, lazy ones inside functions too)."""
    out: dict[str, set[str]] = {}
    for folder in folders:
        for path in (ROOT / folder).rglob("*.py"):
            if skip is not None and path.is_relative_to(skip):
                continue
            for node in ast.walk(_parsed(path)):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    out.setdefault(name.partition(".")[0], set()).add(str(path.relative_to(ROOT)))
    return out


def _third_party(imports: dict[str, set[str]]) -> dict[str, set[str]]:
    return {m: f for m, f in imports.items() if m not in sys.stdlib_module_names and m not in FIRST_PARTY}


def _distributions(module: str) -> set[str]:
    """Return the installed distributions that provide a top-level module."""
    return {_name(d) for d in _packages().get(module, [])}


def _undeclared(folders: list[str], declared: set[str], skip: Path | None = None) -> dict[str, str]:
    missing = {}
    for module, files in sorted(_third_party(_imports(folders, skip)).items()):
        dists = _distributions(module)
        if not dists:
            missing[module] = f"not installed (imported by {sorted(files)})"
        elif not dists & declared:
            missing[module] = f"from {sorted(dists)}, imported by {sorted(files)}"
    return missing


# The [sources] extra (Avro and Protobuf topics of `trends ingest kafka`, the events topic in Avro) is imported only
# here, lazily: a plain `pip install .` bridges JSON topics and runs every other role on a JSON events topic.
SOURCES_USERS = {"ingestion/wire.py", "views/event_avro.py"}


def test_the_pipeline_imports_only_its_declared_dependencies() -> None:
    assert _undeclared(PIPELINE, _declared("sources")) == {}


def test_only_the_wire_decoders_import_the_sources_extra() -> None:
    extra = _declared("sources") - _declared()
    users = {
        f
        for module, files in _third_party(_imports(PIPELINE)).items()
        if _distributions(module) & extra and not _distributions(module) & _declared()
        for f in files
    }
    assert users == SOURCES_USERS
    assert _undeclared(PIPELINE, _declared()).keys() == {"fastavro", "google", "grpc_tools"}


def test_the_pipeline_never_imports_airflow() -> None:
    """The pipeline reaches Airflow over HTTP only: `import airflow` fails in an install without [airflow]."""
    users = _imports(PIPELINE).get("airflow", set())
    assert users == set(), f"outside dags/, these import airflow: {sorted(users)}"


def test_the_dag_files_need_only_the_airflow_extra() -> None:
    assert _undeclared(["dags"], _declared("airflow")) == {}


def test_tests_and_benches_need_only_the_dev_extra() -> None:
    assert _undeclared(["tests", "bench"], _declared("airflow", "sources", "dev"), skip=PEERS) == {}


def test_the_peers_bench_needs_only_the_dev_extra_and_its_own_requirements() -> None:
    """The peers are never the pipeline's dependencies: what bench/peers imports beyond [dev] is in its requirements."""
    own = {p.stem for p in PEERS.rglob("*.py")}
    lines = (PEERS / "requirements.txt").read_text().splitlines()
    required = {_name(line) for line in lines if line.strip() and not line.startswith("#")}
    provided_by = {"pyflink": "apache-flink", "cassandra": "cassandra-driver"}  # module -> distribution
    dev = _declared("airflow", "dev")
    imported = {m for m in _third_party(_imports(["bench/peers"])) if m not in own}
    assert {m for m in imported if provided_by.get(m, m) not in required and not _distributions(m) & dev} == set()
    leaked = {"apache-flink", "quixstreams"} & _declared("airflow", "dev")
    assert not leaked, f"a peer's package leaked into the pipeline's dependencies: {leaked}"


def test_every_declared_dependency_is_used() -> None:
    """A declared package nobody imports is a stale pin (pandas was one), unless its use is written down."""
    imported = {d for m in _third_party(_imports(PIPELINE)) for d in _distributions(m)}
    unused = _declared() - imported - set(NOT_IMPORTED)
    assert unused == set()
    assert _name("pandas") not in _declared(), "pandas: nothing of the pipeline imports it, toArrow does not need it"


def test_dev_includes_airflow_so_make_test_runs_the_dag_tests() -> None:
    optional: dict[str, list[str]] = _project()["optional-dependencies"]  # type: ignore[assignment]
    assert "trends[airflow]" in optional["dev"]
    assert "trends[sources]" in optional["dev"]
    # pandas only bounds what the Spark provider pulls in (PySpark 4.2 and pandas 3 do not go together)
    assert {_name(r) for r in optional["airflow"]} == {
        "apache-airflow",
        "apache-airflow-providers-apache-spark",
        "pandas",
    }
