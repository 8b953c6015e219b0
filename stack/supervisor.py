"""Keep a long-running command up: restart it with exponential back-off whenever it exits non-zero.

``python -m stack.supervisor --state FILE [--backoff S --backoff-max S --healthy-after S] -- CMD…`` runs CMD,
and when it exits with a non-zero status (an exception, a signal, the OOM killer) starts it again after a delay
that doubles with each quick failure (``backoff``, ``2 x backoff``, … up to ``backoff-max``) and falls back to
``backoff`` once a run lasted ``healthy-after`` seconds. Exit status 0 (a requested stop, ``--max-seconds``) ends
the supervisor too. SIGTERM/SIGINT stop it: the signal is passed to the running command, which is awaited, and no
restart follows.

Exit status 78 (:data:`infra.errors.EXIT_CONFIG`) ends it too: the command refused its settings or state (a speed
checkpoint of another view definition), which a restart cannot change; the operator must act. Exit status 75
(:data:`infra.errors.EXIT_CHECKPOINT_LOST`: the speed job's checkpoint was lost under it) is restarted like any
failure — the restart begins a new epoch —, and the state's description names it (``last exit 75: checkpoint lost``).

The state file (JSON, rewritten atomically) says how often the command was restarted, how the last runs ended
(their exit statuses) and when the next start is due: ``trends stack status`` shows it, and the fault suite
(``tests/reliability``) checks it. Each run gets the restart count so far in the environment variable
:data:`RESTARTS_ENV`, so the command can export it (the speed layer's ``trends_speed_restarts_total`` metric).

The stack runs the speed service under it (``stack.services.pipeline.SpeedService``): a streaming job that exits on
a write error (Cassandra down, a schema missing) comes back by itself, and the gaps it leaves stop growing once the
cause is fixed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import FrameType
from typing import Final

from infra.errors import EXIT_CONFIG, EXIT_REASONS
from infra.settings import RESTARTS_ENV
from stack.process import write_private

logger = logging.getLogger("stack.supervisor")

EXITS_KEPT: Final = 20  # exit statuses the state file keeps, newest last


@dataclass(frozen=True)
class SupervisorState:
    """What the state file holds."""

    supervisor_pid: int
    child_pid: int | None
    restarts: int
    started_at: str
    last_exit_code: int | None = None
    last_exit_at: str | None = None
    next_start_at: str | None = None
    stopped: bool = False
    # The exit status of each run that ended (negative: killed by that signal), newest last, at most EXITS_KEPT;
    # a state file written before this field existed reads as [].
    exits: list[int] = field(default_factory=list)

    @classmethod
    def read(cls, path: Path) -> SupervisorState | None:
        """Return the state in a file, or None when there is none (or it is not ours)."""
        try:
            data = json.loads(path.read_text())
            return cls(**data)
        except (OSError, ValueError, TypeError):
            return None

    def write(self, path: Path) -> None:
        """Write the state atomically (a reader never sees half a file)."""
        write_private(path, json.dumps(asdict(self)) + "\n")

    def describe(self) -> str:
        """Return the state as ``trends stack status`` shows it."""
        if not self.restarts and self.last_exit_code is None:
            return "restarts 0"
        text = f"restarts {self.restarts}"
        if self.last_exit_code is not None:
            reason = EXIT_REASONS.get(self.last_exit_code)
            text += f" (last exit {self.last_exit_code}{f': {reason}' if reason else ''} at {self.last_exit_at})"
        if self.child_pid is None and self.next_start_at and not self.stopped:
            text += f", next start at {self.next_start_at}"
        return text


def backoff_delay(consecutive_failures: int, initial_s: float, max_s: float) -> float:
    """Return the wait before restart number ``consecutive_failures`` of quick failures in a row (1, 2, …)."""
    if consecutive_failures < 1:
        return 0.0
    return float(min(max_s, initial_s * 2 ** min(consecutive_failures - 1, 30)))


def _die_with_parent() -> None:
    """Ask Linux to SIGTERM the child when the supervisor dies (even by SIGKILL): no orphaned streaming job."""
    if sys.platform.startswith("linux"):
        import ctypes  # noqa: PLC0415 - only in the forked child, only on Linux

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def supervise(
    cmd: list[str],
    state_file: Path,
    *,
    backoff_s: float = 2.0,
    backoff_max_s: float = 60.0,
    healthy_after_s: float = 60.0,
    max_restarts: int | None = None,
) -> int:
    """Run ``cmd`` until it exits 0 or we are told to stop, restarting it with back-off; return the last status.

    :arg max_restarts: give up after this many restarts (None: never), returning the last failing status.
    """
    stop = threading.Event()
    child: subprocess.Popen[bytes] | None = None

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop.set()
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    state = SupervisorState(supervisor_pid=os.getpid(), child_pid=None, restarts=0, started_at=_now())
    quick_failures = 0
    while not stop.is_set():
        started = time.monotonic()
        # preexec_fn is safe here: the supervisor runs no other threads.
        child = subprocess.Popen(  # noqa: S603 - the command we were given
            cmd,
            env={**os.environ, RESTARTS_ENV: str(state.restarts)},
            preexec_fn=_die_with_parent,  # noqa: PLW1509
        )
        state = SupervisorState(**{**asdict(state), "child_pid": child.pid, "next_start_at": None})
        state.write(state_file)
        code = child.wait()
        ran = time.monotonic() - started
        exits = [*state.exits, code][-EXITS_KEPT:]
        state = SupervisorState(
            **{**asdict(state), "child_pid": None, "last_exit_code": code, "last_exit_at": _now(), "exits": exits}
        )
        refused = code == EXIT_CONFIG
        if code == 0 or refused or stop.is_set() or (max_restarts is not None and state.restarts >= max_restarts):
            state = SupervisorState(**{**asdict(state), "stopped": True})
            state.write(state_file)
            why = (
                "stopped" if stop.is_set() else "done" if code == 0
                else "refused its configuration: not restarted, the operator must act" if refused
                else "too many restarts"
            )  # fmt: skip
            log = logger.error if refused else logger.info
            log("%s exited with status %s after %.0f s (%s)", cmd[0], code, ran, why)
            return code
        quick_failures = 1 if ran >= healthy_after_s else quick_failures + 1
        delay = backoff_delay(quick_failures, backoff_s, backoff_max_s)
        due = (datetime.now(UTC) + timedelta(seconds=delay)).isoformat(timespec="seconds")
        state = SupervisorState(**{**asdict(state), "restarts": state.restarts + 1, "next_start_at": due})
        state.write(state_file)
        logger.warning(
            "%s exited with status %s%s after %.0f s; restart %s in %.1f s", " ".join(cmd[-3:]), code,
            f" ({EXIT_REASONS[code]})" if code in EXIT_REASONS else "", ran, state.restarts, delay,
        )  # fmt: skip
        stop.wait(delay)
    state = SupervisorState(**{**asdict(state), "stopped": True})
    state.write(state_file)
    return state.last_exit_code or 0


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and supervise."""
    parser = argparse.ArgumentParser(prog="python -m stack.supervisor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--state", type=Path, required=True, help="JSON state file (restarts, last exit).")
    parser.add_argument("--backoff", type=float, default=2.0, help="First restart delay, seconds.")
    parser.add_argument("--backoff-max", type=float, default=60.0, help="Longest restart delay, seconds.")
    parser.add_argument("--healthy-after", type=float, default=60.0, help="A run this long resets the back-off.")
    parser.add_argument("--max-restarts", type=int, default=None, help="Give up after this many restarts.")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- the command to run")
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("no command given (put it after --)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)-7s %(name)s: %(message)s")
    code = supervise(
        cmd,
        args.state,
        backoff_s=args.backoff,
        backoff_max_s=args.backoff_max,
        healthy_after_s=args.healthy_after,
        max_restarts=args.max_restarts,
    )
    return code if code >= 0 else 128 - code  # killed by signal N: 128 + N, as a shell reports it


if __name__ == "__main__":
    sys.exit(main())
