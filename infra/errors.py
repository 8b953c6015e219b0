"""Errors that the CLI turns into a clear message and an exit status (1, or 78) instead of a traceback."""

from __future__ import annotations

from typing import ClassVar, Final

# sysexits' EX_CONFIG: the command refuses to run as configured. A supervisor does not restart it (a restart
# with the same settings and state is refused again); the operator's change is needed.
EXIT_CONFIG: Final = 78
# sysexits' EX_TEMPFAIL: the speed job's checkpoint was lost under it (speed_layer.guard); a restart begins a new
# epoch, so a supervisor restarts it.
EXIT_CHECKPOINT_LOST: Final = 75
# what an exit status means, for the supervisor's record (trends stack status)
EXIT_REASONS: Final = {EXIT_CONFIG: "configuration refused", EXIT_CHECKPOINT_LOST: "checkpoint lost"}


class TrendsError(Exception):
    """A known failure with a message meant for the operator."""

    exit_code: ClassVar[int] = 1


class ConfigurationError(TrendsError):
    """The command refuses to run with these settings and this state; restarting it cannot help."""

    exit_code: ClassVar[int] = EXIT_CONFIG


class StackError(TrendsError):
    """The local stack cannot be fetched, started, stopped or reached."""


class SetupError(TrendsError):
    """A deployment's clusters or artifacts cannot be set up: topics, the connector jars."""


class AirflowError(TrendsError):
    """Airflow's REST API refused, failed or did not answer, or a run it follows failed."""


class MigrationError(TrendsError):
    """A CQL migration file is malformed or failed to apply."""


class CheckpointLostError(TrendsError):
    """The speed job's checkpoint vanished (or was replaced) under the running query; a restart is a new epoch."""

    exit_code: ClassVar[int] = EXIT_CHECKPOINT_LOST
