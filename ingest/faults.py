"""Crash points for the crash tests: SIGKILL this process at a named point, the Nth time it is hit.

Set `CHANGELAKE_CRASH_AT=<point>:<n>` (e.g. `after_events_commit:3`). Unset, `hit()` is a dict
lookup and nothing else. The points are where a real crash would hurt most: around the Delta
commit, the position commit and the source acknowledgement, and between the steps of a recovery.
"""

from __future__ import annotations

import os
import signal

POINTS = (
    "before_events_commit",
    "after_events_commit",
    "after_position_commit",
    "after_ack",
    "mid_transaction_flush",
    "snapshot_after_page_commit",
    "snapshot_after_retire",
    # a history-lost recovery (`on_history_lost: resnapshot`), between its durable steps
    "recovery_after_snapshot_requests",
    "recovery_after_tombstone",
    "recovery_after_position",
)

_spec = os.environ.get("CHANGELAKE_CRASH_AT", "")
_point, _, _nth = _spec.partition(":")
if _point and _point not in POINTS:
    raise SystemExit(f"CHANGELAKE_CRASH_AT: unknown point {_point!r}; known: {', '.join(POINTS)}")
_remaining = int(_nth or "1") if _point else 0


def hit(point: str) -> None:
    """Count a pass through `point`; SIGKILL ourselves on the configured pass."""
    global _remaining
    if point != _point:
        return
    _remaining -= 1
    if _remaining == 0:
        os.kill(os.getpid(), signal.SIGKILL)
