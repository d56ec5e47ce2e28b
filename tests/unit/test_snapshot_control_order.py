"""`snapshot pause|resume`: the later command decides, whatever the clocks of the hosts issuing them.

Real delta-rs tables in a temporary warehouse. A snapshot's latest snapshot_control record decides
(BronzeState.snapshot_pauses orders by issued_at); commands come from any host running the CLI, so
a later command can read an earlier clock (another host's, or the same microsecond). The clock is
the one thing set here: the writer's own `_now`.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ingest.bronze import writer as writer_module
from ingest.bronze.writer import BronzeWriter

T0 = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("first_clock", "second_clock"),
    [
        (T0, T0 - timedelta(hours=1)),  # the resume's host runs an hour behind the pause's
        (T0, T0),  # the same microsecond
    ],
)
def test_the_later_command_decides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first_clock: datetime, second_clock: datetime
) -> None:
    writer = BronzeWriter(tmp_path)
    writer.ensure_tables()
    for clock, paused in ((first_clock, True), (second_clock, False), (second_clock, True), (first_clock, False)):
        monkeypatch.setattr(writer_module, "_now", lambda clock=clock: clock)
        writer.append_snapshot_control("src", [("snap-1", "public.t", paused)])
        assert writer.snapshot_pauses("src") == {("src", "snap-1"): paused}
