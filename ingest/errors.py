"""Exception types for ingest: every failure a user can act on carries a message that says how."""

from __future__ import annotations


class IngestError(Exception):
    """Base class for errors that ingest reports to the user (exit code 2, no traceback)."""


class ConfigError(IngestError):
    """The YAML config is malformed, has an unknown key, a wrong value or an unset env var."""


class SourceError(IngestError):
    """The source database refused us or is not set up for change capture."""


class SourceUnavailableError(SourceError):
    """The source cannot be reached right now (connection refused or lost, server restarting): retried."""


class RetriesExhaustedError(IngestError):
    """A source stayed unreachable past `retry.max_seconds` (exit code 75, EX_TEMPFAIL: try again later)."""


class UnmappableEventError(SourceError):
    """A change the source sent cannot be turned into a bronze event; the message names it and the recovery."""


class SlotInvalidatedError(SourceError):
    """The replication slot lost WAL it needed (wal_status = lost); a re-snapshot is required."""


class SlotGapError(SourceError):
    """The slot no longer continues where bronze left off (dropped and recreated, advanced, restored)."""


class BronzeWriteError(IngestError):
    """A Delta commit to bronze failed; the source was not acknowledged past durable data."""


class BronzeUnavailableError(BronzeWriteError):
    """Bronze's storage failed on I/O (disk full, object store unreachable) past the retries (exit code 75).

    Nothing was acknowledged past durable data; the same command later (after space returns)
    continues where bronze left off.
    """
