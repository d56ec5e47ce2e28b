"""Which failures are transient, and the retry loop that rides them out (one place for every source).

Transient: the source cannot be reached right now and will be again without anyone changing
anything: a connection refused, reset or closed; a server shutting down or starting up (SQLSTATE
57P01/57P02/57P03); a slot still held by the previous, dying walsender for a few seconds; MongoDB
network errors, a primary stepping down, server selection timing out. Everything else is
permanent and stops the run with its one-line message: authentication, a missing publication or
slot, an invalidated slot, a config error, an unknown message, a value that cannot be mapped.

A retry restarts the source's capture from its durable position: exactly-once is the same as
after any restart (DESIGN §3), so nothing is lost or doubled by a retry.
"""

from __future__ import annotations

import logging
import random
import sys
import time
from collections.abc import Callable
from contextvars import ContextVar
from typing import Final, TypeVar

import psycopg

from ingest.errors import RetriesExhaustedError, SourceUnavailableError
from ingest.ops import metrics

log = logging.getLogger(__name__)

T = TypeVar("T")

# admin_shutdown, crash_shutdown, cannot_connect_now, too_many_connections, object_in_use (a slot
# still active for the previous walsender), query_canceled (ingest's own statements are bounded by
# statement_timeout: a server too busy or blocked to answer one in time), and every
# connection_exception (class 08).
TRANSIENT_SQLSTATES: Final = frozenset({"57P01", "57P02", "57P03", "53300", "55006", "57014"})
TRANSIENT_SQLSTATE_CLASSES: Final = frozenset({"08"})
# libpq reports a lost or refused connection without a SQLSTATE; these are its words for it.
TRANSIENT_LIBPQ_MESSAGES: Final = (
    "connection refused",
    "could not connect",
    "server closed the connection",
    "terminating connection",
    "the database system is starting up",
    "the database system is shutting down",
    "the database system is in recovery mode",
    "no connection to the server",
    "connection reset",
    "connection timed out",
    "timeout expired",
    "could not receive data",
    "could not send data",
    "ssl syscall error",
    "eof detected",
)
FIRST_DELAY_S: Final = 1.0
SLEEP_SLICE_S: Final = 0.5  # a stop signal interrupts a backoff sleep within this

# Set by `retrying` while its attempt runs: the attempt says through it that it reached the source.
_reached: ContextVar[Callable[[], None] | None] = ContextVar("reached_source", default=None)


def transient_sqlstate(sqlstate: str | None) -> bool:
    """Whether a server error code means "try again later"."""
    return sqlstate is not None and (sqlstate in TRANSIENT_SQLSTATES or sqlstate[:2] in TRANSIENT_SQLSTATE_CLASSES)


def transient_libpq_message(message: str) -> bool:
    """Whether a libpq error without a SQLSTATE is a connection that failed or was lost."""
    text = message.lower()
    return any(m in text for m in TRANSIENT_LIBPQ_MESSAGES)


def is_transient(e: BaseException) -> bool:
    """Whether `e` (raised by a source, the writer or the warehouse) is worth a retry."""
    if isinstance(e, SourceUnavailableError):
        return True
    if isinstance(e, psycopg.OperationalError):
        return transient_sqlstate(e.sqlstate) or (e.sqlstate is None and transient_libpq_message(str(e)))
    # pymongo is imported only by the MongoDB source (0.1 s of a Postgres run's start): an error it
    # raised means it is loaded, so a process that never loaded it has no such error to classify.
    mongo = sys.modules.get("pymongo.errors")
    return mongo is not None and isinstance(e, mongo.ConnectionFailure | mongo.NotPrimaryError)


def reached_source() -> None:
    """Tell the retry loop running the current attempt that the source answered: an outage is over.

    A capture calls it once its connection works (the server has spoken on a fresh stream), so
    that a later failure starts a new outage, with its own `max_seconds` and a short first delay,
    instead of counting from an outage that ended long ago. Outside `retrying` it does nothing.
    """
    reset = _reached.get()
    if reset is not None:
        reset()


def retrying(
    attempt: Callable[[], T],
    source: str,
    should_stop: Callable[[], bool],
    max_seconds: float | None,
    max_delay_s: float,
) -> T:
    """Run `attempt` until it returns; retry transient failures with exponential backoff and jitter.

    One warning per retry says what failed and when the next attempt is. `max_seconds` bounds the
    time since the first failure of an outage (None: forever); past it RetriesExhaustedError says
    how long the source was unreachable. An outage ends when an attempt reaches the source
    (`reached_source()`). A permanent failure, or any failure once `should_stop()`, is raised at once.
    """
    since: float | None = None
    failures = 0

    def outage_over() -> None:
        nonlocal since, failures
        since, failures = None, 0

    while True:
        token = _reached.set(outage_over)
        try:
            return attempt()
        except BaseException as e:
            if should_stop():
                raise
            if not is_transient(e):
                metrics.ERRORS.labels(source, metrics.PERMANENT).inc()
                raise
            metrics.ERRORS.labels(source, metrics.TRANSIENT).inc()
            now = time.monotonic()
            since = since if since is not None else now
            failures += 1
            down = now - since
            if max_seconds is not None and down >= max_seconds:
                raise RetriesExhaustedError(
                    f"source {source!r} unreachable for {down:.0f} s ({failures} attempts; retry.max_seconds = "
                    f"{max_seconds:g}): {e}"
                ) from e
            delay = min(max_delay_s, FIRST_DELAY_S * 2 ** (failures - 1)) * random.uniform(0.5, 1.0)
            log.warning(
                "source=%s unreachable since=%.0fs attempt=%d retry_in=%.1fs error=%s: %s",
                source,
                down,
                failures,
                delay,
                type(e).__name__,
                str(e).strip().splitlines()[0] if str(e).strip() else "",
            )
            _sleep(delay, should_stop)
            if should_stop():
                raise
            metrics.RETRIES.labels(source).inc()
        finally:
            _reached.reset(token)


def _sleep(seconds: float, should_stop: Callable[[], bool]) -> None:
    end = time.monotonic() + seconds
    while not should_stop() and (left := end - time.monotonic()) > 0:
        time.sleep(min(SLEEP_SLICE_S, left))
