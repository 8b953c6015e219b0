"""Process utilities shared by every server the stack runs: pid files, signals, ports, private files, log tails.

The stack's servers (JVMs, Airflow's components, the pipeline's ``trends`` commands) each run in a session (process
group) of their own, started here with their output appended to a log file. A pid file records the pid and the
process's start time, so a reused pid is never taken for ours; stopping signals the group — never a process found
by name — with SIGTERM, then SIGKILL after a timeout.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from infra.errors import StackError
from infra.settings import SECRETS_DIR_ENV, Settings
from infra.settings_env import secret_vars, to_env

logger = logging.getLogger(__name__)

LOG_TAIL_LINES = 30
KILL_WAIT_S = 10.0  # after SIGKILL: the kernel frees a process quickly, but a zombie needs reaping


# -- files -----------------------------------------------------------------------------------------------------
def write_private(path: Path, text: str) -> None:
    """Write a file only its owner may read (it may hold keys or passwords), replacing it atomically.

    A reader sees the old file or the new one, never half of one.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)


def child_env(
    settings: Settings, sections: Collection[str], secrets_dir: Path, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Return the environment of a child process that talks to ``sections`` (e.g. ``kafka``, ``cassandra``).

    It is ``base`` (default: ours) and the settings as ``TRENDS_*`` variables, with no secret in it: every secret
    variable is dropped, and the secrets of ``sections`` alone are written as files into ``secrets_dir`` (0700,
    one 0600 file per variable), which ``TRENDS_SECRETS_DIR`` names. So the speed job never holds the Airflow admin
    password or the API token, and no secret shows in ``/proc/<pid>/environ`` or a process listing.
    """
    secrets = secret_vars(settings)
    env = {
        k: v
        for k, v in (os.environ if base is None else base).items()
        if k.upper() not in secrets and k.upper() != SECRETS_DIR_ENV
    }
    values = to_env(settings)
    env.update({k: v for k, v in values.items() if k not in secrets})
    wanted = {k: values[k] for k, section in secrets.items() if section in sections and k in values}
    write_secrets_dir(secrets_dir, wanted)
    env[SECRETS_DIR_ENV] = str(secrets_dir)
    return env


def write_secrets_dir(folder: Path, secrets: Mapping[str, str]) -> None:
    """Make ``folder`` hold exactly these secrets, one private file each, named by its variable."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    for stale in folder.iterdir():
        if stale.is_file() and stale.name not in secrets:
            stale.unlink()
    for name, value in secrets.items():
        write_private(folder / name, value)


def tail(paths: Iterable[Path], lines: int = LOG_TAIL_LINES) -> str:
    """Return the last lines of each existing file, headed by its name."""
    out = []
    for path in paths:
        if path.is_file() and path.stat().st_size:
            with path.open("rb") as fh:
                fh.seek(max(0, path.stat().st_size - 64 * 1024))
                text = fh.read().decode("utf-8", "replace").splitlines()[-lines:]
            out.append(f"--- {path} (last {len(text)} lines) ---\n" + "\n".join(text))
    return "\n".join(out) or "(no log output)"


def follow(path: Path, *, lines: int, follow_file: bool) -> Iterator[str]:
    """Yield the last lines of a log file, then (optionally) new lines as they are written."""
    if not path.exists():
        return
    yield from tail([path], lines).splitlines()[1:]
    if not follow_file:
        return
    with path.open("r", errors="replace") as fh:
        fh.seek(0, os.SEEK_END)
        while True:
            line = fh.readline()
            if line:
                yield line.rstrip("\n")
            else:
                time.sleep(0.5)


# -- ports -----------------------------------------------------------------------------------------------------
def port_is_open(host: str, port: int, timeout: float = 0.5) -> bool:
    """Tell whether something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def listener_of(port: int) -> str | None:
    """Describe the process that listens on a port, or None when none does (or the system hides it)."""
    try:
        import psutil  # noqa: PLC0415 - optional nicety for the error message

        for conn in psutil.net_connections(kind="tcp"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
                proc = psutil.Process(conn.pid)
                return f"pid {conn.pid} ({' '.join(proc.cmdline())[:120]})"
    except Exception:
        logger.debug("could not look up the owner of port %s", port, exc_info=True)
    return None


def port_owner(port: int) -> str:
    """Describe the process that listens on a port, if the system lets us see it."""
    return listener_of(port) or "another process"


def ensure_port_free(host: str, port: int, what: str, setting: str, *, settle_s: float = 15.0) -> None:
    """Raise a clear error when a port the server needs is already taken by someone else.

    A port held by a connection rather than a listening server (a just-stopped server's sockets still closing, a
    client's connection that happened to take the port) frees itself within seconds: it is waited for up to
    ``settle_s`` before the start is refused.

    :arg setting: the env var that moves the port, named in the message.
    :raises StackError: when the port cannot be bound.
    """
    deadline = time.monotonic() + settle_s
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
                return
            except OSError as exc:
                owner = listener_of(port)
                if owner is None and time.monotonic() < deadline:
                    logger.info("%s: port %s:%s is still held by a closing connection; waiting", what, host, port)
                    time.sleep(0.5)
                    continue
                msg = (
                    f"cannot start {what}: port {host}:{port} is already taken by {owner or 'another process'} "
                    f"that this stack did not start ({exc.strerror}). Stop it, or move the port with {setting}."
                )
                raise StackError(msg) from exc


def http_ok(url: str) -> bool:
    """Tell whether a GET of an HTTP endpoint of ours answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310 - http://host:port of our own process
            return bool(resp.status == 200)
    except OSError:
        return False


# -- processes -------------------------------------------------------------------------------------------------
def process_alive(pid: int) -> bool:
    """Tell whether a process runs (a zombie does not count)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of ours is dead for our purposes
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def reap(pid: int) -> None:
    """Collect the exit status of a child of ours, if it has exited, so it leaves no zombie."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def start_ticks(pid: int) -> str | None:
    """Return the start time of a process (clock ticks since boot), which tells a reused pid apart."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def cmdline(pid: int, settle_s: float = 0.5) -> list[str] | None:
    """Return a process's arguments ([] when it has none: a kernel thread), or None where /proc cannot tell.

    A process still inside ``execve`` shows no arguments for a moment, even after :class:`subprocess.Popen`
    returned: an empty answer is read again for up to ``settle_s``, so a server just launched is not taken for a
    stranger.
    """
    deadline = time.monotonic() + settle_s
    while True:
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return None
        if raw or time.monotonic() > deadline:
            return raw.decode(errors="replace").split("\0") if raw else []
        time.sleep(0.01)


def rss_mib(pid: int) -> float | None:
    """Return the resident memory of one process in MiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def family_rss_mib(pids: Iterable[int]) -> float | None:
    """Return the resident memory of processes and all their descendants (workers, tasks) together, in MiB."""
    total = 0
    for pid in pids:
        for proc in family(pid):
            with contextlib.suppress(Exception):
                total += proc.memory_info().rss
    return total / 2**20 if total else None


class PidFile:
    """The pid file of a server we started: its pid and start time, trusted only while that very process runs."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, pid: int) -> None:
        """Record a process we just started."""
        self.path.write_text(f"{pid} {start_ticks(pid) or ''}\n")

    def running(self, is_ours: Callable[[int], bool] | None = None) -> int | None:
        """Return the recorded pid while that process runs, or None (removing a stale pid file).

        A pid counts as ours when the process is alive, started when the recorded one did (a pid file without a
        start time skips this), and ``is_ours`` (e.g. a look at its command line) accepts it.
        """
        try:
            fields = self.path.read_text().split()
            pid, ticks = int(fields[0]), fields[1] if len(fields) > 1 else None
        except (OSError, ValueError, IndexError):
            return None
        same_start = ticks is None or start_ticks(pid) in (ticks, None)
        if process_alive(pid) and same_start and (is_ours is None or is_ours(pid)):
            return pid
        reap(pid)
        logger.debug("removing stale pid file %s (pid %s)", self.path, pid)
        self.path.unlink(missing_ok=True)
        return None

    def remove(self) -> None:
        """Forget the process (it was stopped)."""
        self.path.unlink(missing_ok=True)

    def mtime(self) -> float:
        """Return when the process was recorded (its launch), in seconds since the epoch.

        :raises OSError: when there is no pid file.
        """
        return self.path.stat().st_mtime


def launch(cmd: Sequence[str], log: Path, *, cwd: Path, env: Mapping[str, str] | None) -> int:
    """Start a server in a session of its own, its output appended to ``log``; return its pid."""
    with log.open("ab") as out:
        out.write(f"\n=== start {datetime.now(UTC).isoformat(timespec='seconds')} ===\n".encode())
        out.flush()
        proc = subprocess.Popen(  # noqa: S603 - our own command line
            list(cmd),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=env,
            start_new_session=True,
        )
    return proc.pid


def signal_group(pid: int, sig: signal.Signals) -> None:
    """Send a signal to the process group of a process we started in its own session."""
    try:
        os.killpg(os.getpgid(pid), sig)
    except ProcessLookupError:
        return
    except PermissionError:
        os.kill(pid, sig)


def stop_groups(pids: Mapping[str, int], timeout_s: float, *, end_leftovers: bool = False) -> None:
    """Stop the process groups of servers we started: SIGTERM, then SIGKILL those still running after ``timeout_s``.

    :arg pids: name -> pid of each group leader (the names go into the log).
    :arg end_leftovers: also end descendants that moved to process groups of their own (Airflow's tasks).
    """
    if not pids:
        return
    descendants = [proc for pid in pids.values() for proc in family(pid)] if end_leftovers else []
    for pid in pids.values():
        signal_group(pid, signal.SIGTERM)
    _wait_gone(pids.values(), timeout_s, poll_s=0.2)
    stubborn = [name for name, pid in pids.items() if process_alive(pid)]
    if stubborn:
        logger.warning("%s ignored SIGTERM for %.0f s; killing", ", ".join(stubborn), timeout_s)
        for name in stubborn:
            signal_group(pids[name], signal.SIGKILL)
    if end_leftovers:
        _end_processes([proc for proc in descendants if _still_running(proc)])
    _wait_gone(pids.values(), KILL_WAIT_S, poll_s=0.1)


def _wait_gone(pids: Iterable[int], timeout_s: float, *, poll_s: float) -> None:
    pending = list(pids)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(process_alive(p) for p in pending):
        time.sleep(poll_s)
        for pid in pending:
            reap(pid)


def family(pid: int) -> list[Any]:
    """Return the process and all its descendants as psutil objects (they survive pid reuse checks)."""
    import psutil  # noqa: PLC0415 - only needed when stopping or measuring

    try:
        proc = psutil.Process(pid)
        return [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return []


def _end_processes(procs: list[Any]) -> None:
    """End processes that outlived their group (Airflow gives each task a process group of its own)."""
    if not procs:
        return
    import psutil  # noqa: PLC0415

    logger.warning("ending %s process(es) left behind", len(procs))
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=5)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()


def _still_running(proc: Any) -> bool:
    try:
        return bool(proc.is_running()) and proc.status() != "zombie"
    except Exception:  # noqa: BLE001 - gone or not ours to inspect: nothing to end
        return False
