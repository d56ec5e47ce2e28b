"""Transient or permanent, and the retry loop (ingest/capture/retry.py), without servers."""

from __future__ import annotations

import time

import psycopg
import pytest
from pymongo.errors import AutoReconnect, NotPrimaryError, OperationFailure, ServerSelectionTimeoutError

from ingest.capture import retry
from ingest.capture.retry import is_transient, retrying
from ingest.errors import ConfigError, RetriesExhaustedError, SlotInvalidatedError, SourceError, SourceUnavailableError


@pytest.mark.parametrize(
    "error",
    [
        SourceUnavailableError("replication stream ended: server closed it"),
        psycopg.errors.AdminShutdown("terminating connection due to administrator command"),
        psycopg.errors.CannotConnectNow("the database system is starting up"),
        psycopg.errors.TooManyConnections("sorry, too many clients already"),
        psycopg.OperationalError('connection failed: Connection refused\n\tIs the server running on "x"?'),
        psycopg.OperationalError("server closed the connection unexpectedly"),
        AutoReconnect("connection reset"),
        ServerSelectionTimeoutError("No servers found yet"),
        NotPrimaryError("not primary"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_transient(error: BaseException) -> None:
    assert is_transient(error)


@pytest.mark.parametrize(
    "error",
    [
        SourceError("publication 'p' does not exist"),
        SlotInvalidatedError("slot is invalidated"),
        ConfigError("sources.0.dsn: field required"),
        psycopg.errors.InvalidPassword('password authentication failed for user "x"'),
        psycopg.errors.InvalidCatalogName('database "x" does not exist'),
        psycopg.OperationalError('could not translate host name "nohost" to address'),
        OperationFailure("Resume of change stream was not possible", 286),
        ValueError("change event without a clusterTime"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_permanent(error: BaseException) -> None:
    assert not is_transient(error)


@pytest.fixture(autouse=True)
def no_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retry, "FIRST_DELAY_S", 0.01)


def test_a_transient_failure_is_retried_until_the_attempt_succeeds(caplog: pytest.LogCaptureFixture) -> None:
    outcomes: list[BaseException | str] = [SourceUnavailableError("down"), AutoReconnect("reset"), "done"]

    def attempt() -> str:
        out = outcomes.pop(0)
        if isinstance(out, BaseException):
            raise out
        return out

    assert retrying(attempt, "src", lambda: False, None, 1.0) == "done"
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 2 and "attempt=1" in warnings[0] and "attempt=2" in warnings[1]
    assert "source=src unreachable" in warnings[0]


def test_a_permanent_failure_is_raised_at_once() -> None:
    calls = []

    def attempt() -> None:
        calls.append(1)
        raise SourceError("publication missing")

    with pytest.raises(SourceError, match="publication missing"):
        retrying(attempt, "src", lambda: False, None, 1.0)
    assert calls == [1]


def test_an_outage_longer_than_max_seconds_gives_up_with_how_long() -> None:
    def attempt() -> None:
        raise SourceUnavailableError("Connection refused")

    t0 = time.monotonic()
    with pytest.raises(RetriesExhaustedError, match=r"unreachable for \d+ s \(\d+ attempts.*Connection refused"):
        retrying(attempt, "src", lambda: False, 0.3, 0.05)
    assert time.monotonic() - t0 < 5


def test_a_stop_ends_the_wait_and_raises_the_failure() -> None:
    stopped = [False]

    def attempt() -> None:
        stopped[0] = True  # the signal arrives during the outage
        raise SourceUnavailableError("down")

    with pytest.raises(SourceUnavailableError):
        retrying(attempt, "src", lambda: stopped[0], None, 60.0)


class FakeClock:
    """monotonic() and sleep() of retry.py's `time`, on a clock that only moves when told."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_second_outage_after_a_long_good_attempt_gets_its_own_window(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression: the outage window (`since`, the attempt count, the backoff) was never reset after
    a reconnect, so a second outage in a long run was given up at once ("unreachable for 401 s")."""
    clock = FakeClock()
    monkeypatch.setattr(retry, "time", clock)
    attempts: list[float] = []

    def attempt() -> str:
        attempts.append(clock.now)
        if len(attempts) == 1:
            raise psycopg.OperationalError("connection refused")
        if len(attempts) == 2:
            retry.reached_source()  # connected: the first outage is over
            clock.now += 400  # streams for 400 s, then the server restarts
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return "done"

    assert retrying(attempt, "shop", lambda: False, 300, 60.0) == "done"
    assert len(attempts) == 3
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "since=0s attempt=1" in warnings[0] and "since=0s attempt=1" in warnings[1], warnings
    assert attempts[2] - (attempts[1] + 400) <= retry.FIRST_DELAY_S  # the backoff starts over too


def test_attempts_that_never_reach_the_source_share_one_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only an attempt that reached the source ends an outage: failures before it count from the first."""
    clock = FakeClock()
    monkeypatch.setattr(retry, "time", clock)

    def attempt() -> None:
        clock.now += 10  # each connection attempt times out after 10 s
        raise SourceUnavailableError("timeout expired")

    with pytest.raises(RetriesExhaustedError, match="unreachable for"):
        retrying(attempt, "shop", lambda: False, 300, 60.0)
    assert clock.now < 400


def test_reached_source_outside_a_retry_loop_does_nothing() -> None:
    retry.reached_source()
