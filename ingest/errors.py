"""Exception types for ingest: every failure a user can act on carries a message that says how."""

from __future__ import annotations


class IngestError(Exception):
    """Base class for errors that ingest reports to the user (exit code 2, no traceback)."""


class ConfigError(IngestError):
    """The YAML config is malformed, has an unknown key, a wrong value or an unset env var."""


class SourceError(IngestError):
    """The source database refused us or is not set up for change capture."""


class SlotInvalidatedError(SourceError):
    """The replication slot lost WAL it needed (wal_status = lost); a re-snapshot is required."""


class SlotGapError(SourceError):
    """The slot no longer continues where bronze left off (dropped and recreated, advanced, restored)."""


class BronzeWriteError(IngestError):
    """A Delta commit to bronze failed; the source was not acknowledged past durable data."""
