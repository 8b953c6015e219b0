"""What one request may read (``serving.max_read_mb``), charged as rows are read or served from a cache."""

from __future__ import annotations

from serving.served_row import ServedRow


class ReadBudget:
    """What one request may read: sketch bytes up to ``serving.max_read_mb``; rows and bytes are counted."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.rows = 0
        self.bytes = 0

    def charge(self, bucket: ServedRow) -> None:
        """Count a row read.

        :raises ReadBudgetExceededError: the request has read more sketch bytes than allowed.
        """
        self.charge_bytes(bucket.sketch_bytes)

    def charge_bytes(self, sketch_bytes: int, rows: int = 1) -> None:
        """Count rows served from the answer cache as if read (the same question costs the same budget).

        :raises ReadBudgetExceededError: the request has read more sketch bytes than allowed.
        """
        self.rows += rows
        self.bytes += sketch_bytes
        if self.bytes > self.max_bytes:
            raise ReadBudgetExceededError(self.max_bytes, self.rows)


class ReadBudgetExceededError(ValueError):
    """A request reads more sketch bytes than ``serving.max_read_mb`` allows (the API answers 400)."""

    def __init__(self, max_bytes: int, rows: int) -> None:
        mib = max_bytes / (1024 * 1024)
        super().__init__(
            f"this answer reads more than {mib:g} MiB of sketches (serving.max_read_mb; {rows} rows read): ask for "
            "a shorter window or a narrower answer (count and series read no sketches); long windows are cheap "
            "where the batch layer's hourly and daily rollups serve them"
        )
