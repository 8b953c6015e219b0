"""Errors that the CLI turns into a clear message and exit code 1 instead of a traceback."""

from __future__ import annotations


class TrendsError(Exception):
    """A known failure with a message meant for the operator."""


class StackError(TrendsError):
    """The local stack cannot be fetched, started, stopped or reached."""


class MigrationError(TrendsError):
    """A CQL migration file is malformed or failed to apply."""
