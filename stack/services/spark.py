"""A Spark standalone cluster on this machine (a master and workers from pyspark's own ``spark-class``).

For tests and demos of the jobs on a cluster; no jars to fetch, as pyspark ships them.
"""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path
from typing import Any

from typing_extensions import override

from infra.settings import Settings
from infra.settings_env import env_var
from stack.services.base import LoopbackProcess


class SparkDaemon(LoopbackProcess):
    """What the master and the workers share: ``spark-class`` on loopback, its output as its log, no stored data."""

    bundle = None
    _java = ""  # the java `up` chose, handed to spark-class as JAVA_HOME

    @property
    @override
    def start_timeout(self) -> float:
        return self.settings.stack.spark_start_timeout_s

    @override
    def render_config(self) -> Path:
        conf = self.conf_dir / "spark-defaults.conf"
        conf.write_text("spark.ui.showConsoleProgress false\n")
        return conf

    @staticmethod
    def spark_class() -> str:
        """Return pyspark's ``bin/spark-class``."""
        import pyspark  # noqa: PLC0415 - heavy, and only needed here

        return str(Path(pyspark.__file__).parent / "bin" / "spark-class")

    @override
    def process_env(self) -> dict[str, str]:
        # SPARK_CONF_DIR heads the JVM's classpath, which is how `is_ours` recognises the process.
        env = {**os.environ, "SPARK_CONF_DIR": str(self.conf_dir), "SPARK_LOCAL_IP": self.host}
        if self._java:
            env["JAVA_HOME"] = str(Path(self._java).resolve().parent.parent)
        return env

    @override
    def prepare(self, java: str, config: Path) -> None:
        self._java = java

    @override
    def data_paths(self) -> list[Path]:
        return []


class SparkMaster(SparkDaemon):
    """The Spark standalone master."""

    name = "spark-master"

    @property
    @override
    def client_port(self) -> int:
        return self.settings.stack.spark_master_port

    @property
    def url(self) -> str:
        """Return the master URL to give ``TRENDS_SPARK__MASTER``."""
        return f"spark://{self.host}:{self.client_port}"

    @property
    @override
    def address(self) -> str:
        return self.url

    @override
    def ports(self) -> list[tuple[int, str, str]]:
        st = self.settings.stack
        return [
            (st.spark_master_port, "RPC", env_var("stack.spark_master_port")),
            (st.spark_master_webui_port, "web UI", env_var("stack.spark_master_webui_port")),
        ]

    @override
    def command(self, java: str, config: Path) -> list[str]:
        st = self.settings.stack
        return [
            self.spark_class(),
            "org.apache.spark.deploy.master.Master",
            "--host", self.host, "--port", str(st.spark_master_port), "--webui-port", str(st.spark_master_webui_port),
        ]  # fmt: skip

    def state(self) -> dict[str, Any]:
        """Return the master's /json status (workers, applications), or {} while it does not answer."""
        try:
            url = f"http://{self.host}:{self.settings.stack.spark_master_webui_port}/json/"
            with urllib.request.urlopen(url, timeout=2) as resp:
                return dict(json.load(resp))
        except (OSError, ValueError):
            return {}

    @override
    def accepts_clients(self) -> bool:
        return self.state().get("status") == "ALIVE"


class SparkWorker(SparkDaemon):
    """Spark standalone worker number ``index`` (1, 2, …), registered with the local master."""

    def __init__(self, settings: Settings, index: int) -> None:
        self.index = index
        self.name = f"spark-worker-{index}"
        super().__init__(settings)

    @property
    def webui_port(self) -> int:
        """Return this worker's web UI port: the setting for the first worker, the next ones after it."""
        return self.settings.stack.spark_worker_webui_port + self.index - 1

    @property
    @override
    def client_port(self) -> int:
        return self.webui_port

    @override
    def ports(self) -> list[tuple[int, str, str]]:
        return [(self.webui_port, "web UI", env_var("stack.spark_worker_webui_port"))]

    @override
    def command(self, java: str, config: Path) -> list[str]:
        st = self.settings.stack
        return [
            self.spark_class(),
            "org.apache.spark.deploy.worker.Worker",
            SparkMaster(self.settings).url,
            "--host", self.host, "--webui-port", str(self.webui_port), "--cores", str(st.spark_worker_cores),
            "--memory", st.spark_worker_memory, "--work-dir", str(self.home / "work"),
        ]  # fmt: skip

    @override
    def accepts_clients(self) -> bool:
        """Tell whether the master lists this worker as ALIVE."""
        workers = SparkMaster(self.settings).state().get("workers", [])
        return any(w.get("state") == "ALIVE" and f":{self.webui_port}" in w.get("webuiaddress", "") for w in workers)

    @override
    def data_paths(self) -> list[Path]:
        return [self.home / "work"]
