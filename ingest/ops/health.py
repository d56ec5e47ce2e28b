"""A source's health from what the server and bronze say: alerts, a state, `status --json` (pure, no I/O).

The watcher of a running ingest and `status --json` judge with the same rules (docs/operations.md):
- `slot_lost` / `slot_missing`: the slot was invalidated (wal_status `lost`) or does not exist;
  changes are gone or not being kept. State `lost`.
- `source_unreachable`: the source server did not answer. State `unreachable`.
- `writer_stale`: a writer has not raised its position for `alerts.max_position_age_seconds`. State `stale`.
- `wal_unreserved`: the slot's WAL is no longer reserved; the next checkpoint may invalidate it.
- `slot_near_limit`: the slot holds `alerts.slot_keep_fraction` of `max_slot_wal_keep_size`.
- `slot_lag`: slot lag above `alerts.max_lag_bytes`. These three: state `lagging`.
- `schema_changed`: a captured table changed shape (an event, held a while: ingest/ops/watch.py).
  The state stays `healthy`: ingest follows the change itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import IntEnum, StrEnum
from typing import Any, Final

from ingest.config import AlertsConfig
from ingest.events import WriterKind, WriterPosition
from ingest.positions import SnapshotProgress, safe_bound

SCHEMA_VERSION: Final = 1


class State(StrEnum):
    """A source's health, from best to worst."""

    HEALTHY = "healthy"
    LAGGING = "lagging"
    STALE = "stale"
    LOST = "lost"
    UNREACHABLE = "unreachable"


class ExitCode(IntEnum):
    """`status --json` exit codes, by the worst source state (1, 2 and 75 keep their CLI meaning)."""

    HEALTHY = 0
    LAGGING = 3
    STALE = 4
    LOST_OR_UNREACHABLE = 5


STATE_EXIT: Final = {
    State.HEALTHY: ExitCode.HEALTHY,
    State.LAGGING: ExitCode.LAGGING,
    State.STALE: ExitCode.STALE,
    State.LOST: ExitCode.LOST_OR_UNREACHABLE,
    State.UNREACHABLE: ExitCode.LOST_OR_UNREACHABLE,
}
_STATE_RANK: Final = {s: i for i, s in enumerate(State)}


class AlertKind(StrEnum):
    """What an alert is about (the `alert` label of changelake_alert_active)."""

    SLOT_LAG = "slot_lag"
    SLOT_NEAR_LIMIT = "slot_near_limit"
    WAL_UNRESERVED = "wal_unreserved"
    SLOT_LOST = "slot_lost"
    SLOT_MISSING = "slot_missing"
    WRITER_STALE = "writer_stale"
    SOURCE_UNREACHABLE = "source_unreachable"
    SCHEMA_CHANGED = "schema_changed"


ALERT_STATE: Final = {
    AlertKind.SLOT_LAG: State.LAGGING,
    AlertKind.SLOT_NEAR_LIMIT: State.LAGGING,
    AlertKind.WAL_UNRESERVED: State.LAGGING,
    AlertKind.WRITER_STALE: State.STALE,
    AlertKind.SLOT_LOST: State.LOST,
    AlertKind.SLOT_MISSING: State.LOST,
    AlertKind.SOURCE_UNREACHABLE: State.UNREACHABLE,
    AlertKind.SCHEMA_CHANGED: State.HEALTHY,
}


@dataclass(frozen=True, slots=True)
class SlotState:
    """A Postgres slot as the server reports it (sizes in bytes; None: no slot, not known or not limited)."""

    slot: str
    exists: bool
    confirmed_flush_lsn: int | None
    current_wal_lsn: int
    wal_status: str | None
    safe_wal_size_bytes: int | None
    max_wal_keep_size_bytes: int | None  # None: max_slot_wal_keep_size = -1 (unlimited)
    active_pid: int | None
    lag_bytes: int | None  # WAL the slot holds back: current WAL position minus confirmed_flush_lsn


@dataclass(frozen=True, slots=True)
class Alert:
    """One condition that needs attention, with a message that says what to do.

    `writer_id` or `table`: what the alert is about when a source can have several at once.
    """

    kind: AlertKind
    message: str
    writer_id: str | None = None
    table: str | None = None

    @property
    def subject(self) -> str | None:
        """The writer or table the alert is about (None: the source as a whole)."""
        return self.writer_id or self.table


def slot_alerts(slot: SlotState, cfg: AlertsConfig) -> list[Alert]:
    """The slot's alerts: lost or missing, WAL unreserved, near max_slot_wal_keep_size, lag over the threshold."""
    if not slot.exists:
        return [Alert(AlertKind.SLOT_MISSING, f"slot {slot.slot} does not exist: run `changelake-ingest setup`")]
    if slot.wal_status == "lost":
        return [
            Alert(
                AlertKind.SLOT_LOST,
                f"slot {slot.slot} is invalidated (wal_status lost): changes were removed before ingest read them; "
                "`changelake-ingest run` says how to recover",
            )
        ]
    out = []
    lag = slot.lag_bytes
    if slot.wal_status == "unreserved":
        out.append(
            Alert(
                AlertKind.WAL_UNRESERVED,
                f"slot {slot.slot} wal_status unreserved: the next checkpoint invalidates it unless ingest catches up",
            )
        )
    keep = slot.max_wal_keep_size_bytes
    if keep is not None and lag is not None:
        limit = cfg.slot_keep_fraction * keep
        near = lag >= limit or (slot.safe_wal_size_bytes is not None and slot.safe_wal_size_bytes <= keep - limit)
        if near:
            out.append(
                Alert(
                    AlertKind.SLOT_NEAR_LIMIT,
                    f"slot {slot.slot} holds {lag:,} bytes of WAL, past {cfg.slot_keep_fraction:.0%} of "
                    f"max_slot_wal_keep_size ({keep:,} bytes); safe_wal_size {slot.safe_wal_size_bytes}",
                )
            )
    if cfg.max_lag_bytes is not None and lag is not None and lag > cfg.max_lag_bytes:
        out.append(
            Alert(
                AlertKind.SLOT_LAG, f"slot {slot.slot} lag {lag:,} bytes > alerts.max_lag_bytes {cfg.max_lag_bytes:,}"
            )
        )
    return out


def writer_alerts(rows: Sequence[tuple[WriterPosition, datetime]], cfg: AlertsConfig, now: datetime) -> list[Alert]:
    """A `writer_stale` alert for each writer not raised for `max_position_age_seconds`."""
    if cfg.max_position_age_seconds is None:
        return []
    out = []
    for pos, updated in sorted(rows, key=lambda r: r[0].writer_id):
        age = (now - updated).total_seconds()
        if age > cfg.max_position_age_seconds:
            out.append(
                Alert(
                    AlertKind.WRITER_STALE,
                    f"writer {pos.writer_id} has not raised its position for {age:,.0f} s "
                    f"(alerts.max_position_age_seconds {cfg.max_position_age_seconds:g}): is ingest running?",
                    pos.writer_id,
                )
            )
    return out


def worst(states: Sequence[State]) -> State:
    """The worst of `states` (healthy if none)."""
    return max(states, key=_STATE_RANK.__getitem__, default=State.HEALTHY)


@dataclass(frozen=True, slots=True)
class SourceHealth:
    """Everything `status --json` says of one source at one moment (see `to_json`)."""

    name: str
    kind: str
    checked_at: datetime
    error: str | None = None  # why the source server could not be probed
    slot: SlotState | None = None
    writers: tuple[tuple[WriterPosition, datetime], ...] = ()
    last_commit_at: datetime | None = None
    alerts: tuple[Alert, ...] = field(default=())

    @property
    def state(self) -> State:
        """The worst state any alert puts the source in."""
        return worst([ALERT_STATE[a.kind] for a in self.alerts])

    def to_json(self, fmt: Callable[[int], str]) -> dict[str, Any]:
        """The source's object of `status --json` (schema: docs/operations.md); `fmt` prints a position."""
        bound = safe_bound(p for p, _ in self.writers)
        writers, snapshots = [], []
        for pos, updated in sorted(self.writers, key=lambda r: r[0].writer_id):
            writers.append(
                {
                    "writer_id": pos.writer_id,
                    "kind": pos.writer_kind.value,
                    "durable_position": pos.durable_lsn,
                    "durable_position_text": fmt(pos.durable_lsn),
                    "updated_at": _iso(updated),
                    "position_age_seconds": round((self.checked_at - updated).total_seconds(), 3),
                }
            )
            if pos.writer_kind is WriterKind.SNAPSHOT:
                snapshots.append(_snapshot_json(SnapshotProgress.from_row(pos)))
        return {
            "name": self.name,
            "kind": self.kind,
            "state": self.state.value,
            "reachable": self.error is None,
            "error": self.error,
            "slot": _slot_json(self.slot, fmt) if self.slot is not None else None,
            "safe_bound": bound,
            "safe_bound_text": fmt(bound) if bound is not None else None,
            "last_commit_at": _iso(self.last_commit_at) if self.last_commit_at is not None else None,
            "writers": writers,
            "snapshots": snapshots,
            "alerts": [
                {"kind": a.kind.value, "message": a.message, "writer_id": a.writer_id, "table": a.table}
                for a in self.alerts
            ],
        }


def _iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def _slot_json(s: SlotState, fmt: Callable[[int], str]) -> dict[str, Any]:
    return {
        "name": s.slot,
        "exists": s.exists,
        "wal_status": s.wal_status,
        "confirmed_flush_lsn": s.confirmed_flush_lsn,
        "confirmed_flush_lsn_text": fmt(s.confirmed_flush_lsn) if s.confirmed_flush_lsn is not None else None,
        "current_wal_lsn": s.current_wal_lsn,
        "current_wal_lsn_text": fmt(s.current_wal_lsn),
        "lag_bytes": s.lag_bytes,
        "safe_wal_size_bytes": s.safe_wal_size_bytes,
        "max_wal_keep_size_bytes": s.max_wal_keep_size_bytes,
        "active_pid": s.active_pid,
    }


def _snapshot_json(p: SnapshotProgress) -> dict[str, Any]:
    left = max(0, p.estimated_rows - p.rows) if p.estimated_rows is not None else None
    return {
        "table": p.table,
        "snapshot_id": p.snapshot_id,
        "writer_id": p.writer_id,
        "pages": p.pages,
        "rows": p.rows,
        "estimated_rows": p.estimated_rows,
        "rows_left": left,
        "rows_per_second": p.rows_per_s,
        "paused": p.paused,
        "where": p.where,
    }


def report(sources: Sequence[tuple[SourceHealth, Callable[[int], str]]], now: datetime) -> dict[str, Any]:
    """The whole `status --json` document: every source, the worst state and the exit code it means."""
    state = worst([h.state for h, _ in sources])
    return {
        "schema_version": SCHEMA_VERSION,
        "checked_at": _iso(now),
        "state": state.value,
        "exit_code": int(STATE_EXIT[state]),
        "sources": [h.to_json(fmt) for h, fmt in sources],
    }
