"""Progress lines of ``trends ingest`` on stderr, and a graceful stop on Ctrl-C/SIGTERM.

On a terminal the line is redrawn in place (a bar when the total is known); in logs a new line is written per
interval. The first Ctrl-C asks the run to stop reading and flush what is queued; a second one aborts.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import TextIO

from ingestion.producer import IngestSummary

BAR_WIDTH = 24


class Progress:
    """Render ``[####----]  45%  123,456 records  56,789/s  sent …  invalid …`` at most once per interval."""

    def __init__(self, interval_s: float, *, out: TextIO | None = None, enabled: bool = True) -> None:
        self.interval_s = interval_s
        self.out = out or sys.stderr
        self.enabled = enabled
        self._tty = self.out.isatty()
        self._started = time.monotonic()
        self._last = self._started
        self._drawn = False

    def update(
        self,
        records: int,
        summary: IngestSummary | None = None,
        *,
        fraction: float | None = None,
        force: bool = False,
    ) -> None:
        """Show the progress if the interval has passed (or ``force``)."""
        now = time.monotonic()
        if not self.enabled or (not force and now - self._last < self.interval_s):
            return
        self._last = now
        elapsed = max(now - self._started, 1e-9)
        parts = []
        if fraction is not None:
            filled = round(BAR_WIDTH * min(1.0, max(0.0, fraction)))
            parts.append(f"[{'#' * filled}{'-' * (BAR_WIDTH - filled)}] {fraction:4.0%}")
        parts.append(f"{records:,} records  {records / elapsed:,.0f}/s")
        if summary is not None:
            parts.append(f"sent {summary.sent:,}  invalid {summary.invalid_total:,}  failed {summary.failed:,}")
        line = "  ".join(parts)
        if self._tty:
            self.out.write("\r" + line + "\x1b[K")
            self._drawn = True
        else:
            self.out.write(line + "\n")
        self.out.flush()

    def done(self) -> None:
        """End the redrawn line so the summary starts on a fresh one."""
        if self._drawn:
            self.out.write("\n")
            self.out.flush()
            self._drawn = False


class Stopper:
    """A flag that signal handlers set and produce loops poll."""

    def __init__(self) -> None:
        self.stop = False

    def __call__(self) -> bool:
        """Tell whether a stop was asked."""
        return self.stop


@contextlib.contextmanager
def graceful_stop(out: TextIO | None = None) -> Iterator[Stopper]:
    """Turn the first SIGINT/SIGTERM into a stop request; the second SIGINT raises ``KeyboardInterrupt``.

    Outside the main thread (where handlers cannot be installed) the stopper is only set by code.
    """
    stopper = Stopper()
    if threading.current_thread() is not threading.main_thread():
        yield stopper
        return
    stream = out or sys.stderr

    def handler(signum: int, _frame: FrameType | None) -> None:
        stopper.stop = True
        stream.write(f"\n{signal.Signals(signum).name}: stopping, flushing what is queued (Ctrl-C again aborts)\n")
        signal.signal(signal.SIGINT, signal.default_int_handler)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stopper
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
