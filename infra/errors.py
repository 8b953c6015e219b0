"""Errors that the CLI turns into a clear message and an exit status (1, or 78) instead of a traceback."""

from __future__ import annotations

from typing import ClassVar, Final

# sysexits' EX_CONFIG: the command refuses to run as configured. A supervisor does not restart it (a restart
# with the same settings and state is refused again); the operator's change is needed.
EXIT_CONFIG: Final = 78


class TrendsError(Exception):
    """A known failure with a message meant for the operator."""

    exit_code: ClassVar[int] = 1


class ConfigurationError(TrendsError):
    """The command refuses to run with these settings and this state; restarting it cannot help."""

    exit_code: ClassVar[int] = EXIT_CONFIG


class StackError(TrendsError):
    """The local stack cannot be fetched, started, stopped or reached."""


class MigrationError(TrendsError):
    """A CQL migration file is malformed or failed to apply."""
