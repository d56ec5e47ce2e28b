"""The pgoutput transport: START_REPLICATION on a replication connection via psycopg's libpq layer.

psycopg 3 has no replication API, so this module speaks the streaming-replication sub-protocol
directly over `psycopg.pq.PGconn` (COPY BOTH): XLogData and keepalive messages in, standby status
updates out. It decodes nothing of pgoutput itself.
"""

from __future__ import annotations

import ipaddress
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple

import psycopg
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ingest.capture.retry import transient_libpq_message, transient_sqlstate
from ingest.errors import SlotInvalidatedError, SourceError, SourceUnavailableError
from ingest.sources.postgres.inflight import InflightTransaction
from ingest.sources.postgres.pgoutput import PG_EPOCH_OFFSET_US, PROTO_VERSION, PROTO_VERSION_STREAMING
from ingest.sources.postgres.streamed import STREAM_CONTROL, DecodedTransaction, StreamedTransactions

MSG_XLOGDATA = ord("w")
MSG_KEEPALIVE = ord("k")
MSG_STANDBY_STATUS = b"r"
XLOGDATA_HEADER = struct.Struct("!QQQ")  # wal_start, wal_end, send_time
_unpack_xlogdata = XLOGDATA_HEADER.unpack_from
KEEPALIVE = struct.Struct("!QQB")  # wal_end, send_time, reply_requested
STANDBY_STATUS = struct.Struct("!cQQQQB")  # 'r', written, flushed, applied, client_time, reply
# The first server version whose pgoutput streams in-progress transactions (protocol 2).
STREAMING_SERVER_VERSION = 140000

# Output functions in the walsender run with these settings, so `record` values are deterministic
# whatever the database's or role's defaults: dates, times, intervals, floats, bytea and money print
# one way, and text arrives as UTF-8, converted by the server from the database's encoding (review
# C6). A SQL_ASCII database is the exception (`pin_value_encoding`).
SESSION_OPTIONS = (
    "-c DateStyle=ISO -c TimeZone=UTC -c IntervalStyle=iso_8601 -c extra_float_digits=3 "
    "-c client_encoding=UTF8 -c bytea_output=hex -c lc_monetary=C"
)
# Ingest's own commits (heartbeats, drain and verify markers, snapshot watermarks) are logical
# messages that only need a WAL position, never a standby's confirmation. Under synchronous
# replication a commit waits for the sync standbys, and with `synchronous_standby_names = '*'`
# ingest's own walsender is one: its heartbeat waited on the loop that must acknowledge it, and
# every application commit waited behind them.
OWN_COMMITS_OPTIONS = "-c synchronous_commit=local"
# A peer that stops answering (a dead host, a blackholed path) is noticed by TCP within about
# half a minute: keepalive probes while idle, and a cap on how long sent data may stay unacknowledged.
CONNECT_TIMEOUT_S = 10
KEEPALIVES_IDLE_S = 10
KEEPALIVES_INTERVAL_S = 5
KEEPALIVES_COUNT = 3
TCP_USER_TIMEOUT_MS = 30_000
# A peer that keeps the connection open but answers nothing (a frozen server, a stalled proxy)
# passes every TCP check: ingest's own short statements are bounded by the server
# (statement_timeout) and by ingest itself (`abort_after`), and the stream by its silence check.
OWN_STATEMENT_TIMEOUT_MS = 15_000
OWN_STATEMENT_DEADLINE_S = 20.0
STATUS_SEND_DEADLINE_S = 10.0  # a standby status that cannot be sent within this: the path is stalled


class XLogData(NamedTuple):
    """One pgoutput message and the WAL position the server sent it at.

    A NamedTuple (one per message on the hot path: built ~3x faster than a frozen dataclass).
    """

    wal_start: int
    wal_end: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class Keepalive:
    """The server's keepalive: how far it has sent, and whether it wants a status reply now."""

    wal_end: int
    reply_requested: bool


def _plain_host(host: str) -> bool:
    """Whether `host` looks like a host name, an IP address or a socket directory, not a misparse.

    libpq takes everything after the first '@' of a URI for the host, so an unescaped '@' in a
    password leaves the rest of the password in `host`.
    """
    if host.startswith("/"):
        return "@" not in host
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return not any(c in host for c in "@/:?#%[] ")


def safe_dsn(dsn: str) -> str:
    """The DSN with any password (and any host that may hold a fragment of one) removed, for logs and errors."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparseable DSN>"
    params.pop("password", None)
    hosts = str(params.get("host", "")).split(",")
    if params.get("host") and not all(_plain_host(h) for h in hosts):
        params["host"] = "<redacted>"
    return make_conninfo(**{k: str(v) for k, v in params.items()})


def session_conninfo(dsn: str, application_name: str, own_statements: bool = False, **extra: str) -> str:
    """`dsn` plus what every ingest connection needs: deterministic value output, local commits, timeouts.

    `application_name` is used unless the DSN names one (the replication connection's is what
    `pg_stat_replication` shows: keep it out of `synchronous_standby_names`). `own_statements`:
    the session runs only ingest's own short statements, bounded by OWN_STATEMENT_TIMEOUT_MS. A
    DSN libpq cannot parse is a SourceError that does not quote it (the config check refuses such
    a DSN first).
    """
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        raise SourceError("the source's dsn is not a valid libpq connection string or URI (not shown)") from None
    opts = [str(params.get("options", "")), SESSION_OPTIONS, OWN_COMMITS_OPTIONS]
    if own_statements:
        opts.append(f"-c statement_timeout={OWN_STATEMENT_TIMEOUT_MS}")
    settings = {
        "connect_timeout": str(CONNECT_TIMEOUT_S),
        "keepalives": "1",
        "keepalives_idle": str(KEEPALIVES_IDLE_S),
        "keepalives_interval": str(KEEPALIVES_INTERVAL_S),
        "keepalives_count": str(KEEPALIVES_COUNT),
        "tcp_user_timeout": str(TCP_USER_TIMEOUT_MS),
        "application_name": application_name,
    }
    chosen = {k: v for k, v in settings.items() if k not in params}  # the DSN's own choice wins
    return make_conninfo(dsn, options=" ".join(o for o in opts if o).strip(), **chosen, **extra)


def application_name(source: str) -> str:
    """The application_name of a source's connections: `changelake_<source>`."""
    return f"changelake_{source}"


@contextmanager
def abort_after(fileno: int, seconds: float, what: str) -> Iterator[None]:
    """Run the block; if it takes longer than `seconds`, shut the connection's socket down.

    For a blocking call on a peer that keeps the connection open and answers nothing: libpq then
    fails at once ("server closed the connection"), and the block's failure becomes
    SourceUnavailableError saying `what` did not answer (the run reconnects). The connection is
    unusable afterwards.
    """
    fired = threading.Event()

    def fire() -> None:
        fired.set()
        try:
            with socket.socket(fileno=os.dup(fileno)) as sock:
                sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # closed meanwhile: the call has ended anyway

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    try:
        yield
    except BaseException as e:
        if fired.is_set():
            raise SourceUnavailableError(f"{what}: no answer from the server within {seconds:g} s") from e
        raise
    finally:
        timer.cancel()
    if fired.is_set():
        raise SourceUnavailableError(f"{what}: no answer from the server within {seconds:g} s")


def pin_value_encoding(conn: pq.abc.PGconn, who: str) -> None:
    """On a SQL_ASCII database, have row values sent as the bytes they are (review C6).

    SESSION_OPTIONS asks for UTF-8, which the server converts any other encoding to. A SQL_ASCII
    database stores bytes in no encoding, and the server, asked for UTF-8, checks them instead:
    one non-UTF-8 byte ended the stream with `invalid byte sequence` at the same change on every
    start. Sent as they are, such values meet the source's `non_utf8` policy (values.py).
    For the connections that read row values (the stream, snapshot pages); not for psycopg's.
    `who` names the connection in an error.
    """
    if conn.parameter_status(b"server_encoding") != b"SQL_ASCII":
        return
    res = conn.exec_(b"SET client_encoding = 'SQL_ASCII'")
    if res.status != pq.ExecStatus.COMMAND_OK:
        msg = (res.error_message or b"").decode(errors="replace").strip()
        raise SourceError(f"{who}: cannot set client_encoding on a SQL_ASCII database: {msg}")


def connect_value_session(name: str, dsn: str, who: str) -> pq.abc.PGconn:
    """A plain connection with the stream's value output settings, for reading row values.

    Values come byte for byte as the stream sends them (SESSION_OPTIONS, pin_value_encoding). An
    unreachable server is SourceUnavailableError when libpq says so, else SourceError; `who` names
    the connection in errors.
    """
    conn = pq.PGconn.connect(session_conninfo(dsn, application_name(name)).encode())
    if conn.status != pq.ConnStatus.OK:
        msg = conn.get_error_message().strip()
        conn.finish()
        error = SourceUnavailableError if transient_libpq_message(msg) else SourceError
        raise error(f"source {name!r}: {who} to {safe_dsn(dsn)} failed: {msg}")
    pin_value_encoding(conn, f"source {name!r}: {who}")
    return conn


class ReplicationStream:
    """Owns one replication connection streaming a logical slot.

    Responsibilities: connect with `replication=database`, start pgoutput (protocol 1, logical
    messages on; protocol 2 with `streaming 'on'` on PostgreSQL 14+ unless turned off), hand out
    XLogData/keepalive messages (a streamed transaction only once committed, framed as protocol 1
    frames it, its changes or its rows decoded as they arrived: streamed.py), and send standby
    status updates. Flushing
    an LSN tells the server it may recycle WAL up to it: a slot left unacknowledged keeps all WAL
    since its confirmed position on the server's disk (bounded by max_slot_wal_keep_size, after
    which the slot is invalidated).
    """

    def __init__(
        self,
        dsn: str,
        slot: str,
        publication: str,
        start_lsn: int = 0,
        app_name: str = "changelake",
        streaming: bool = True,
        inflight: Callable[[int], InflightTransaction] | None = None,
    ) -> None:
        """Prepare a stream of `slot` over `publication`, from `start_lsn` (0 = the slot's own).

        `app_name` is the connection's application_name: the name `pg_stat_replication` and
        `synchronous_standby_names` know this walsender by. `streaming`: have a server of 14 or
        later stream transactions larger than its `logical_decoding_work_mem` while they run
        (held here until they commit) instead of spilling them to its own disk. `inflight(xid)`:
        a decoder of a streamed transaction's changes as they arrive (streamed.py); a transaction
        it decoded is handed on as a DecodedTransaction between its Begin and Commit.
        """
        self.dsn = dsn
        self.app_name = app_name
        self.slot = slot
        self.publication = publication
        self.start_lsn = start_lsn
        self._conn: pq.abc.PGconn | None = None
        self.bytes_received = 0
        self.streaming = streaming
        self.inflight = inflight
        self._streamed: StreamedTransactions | None = None
        self._replay: Generator[bytes | DecodedTransaction, None, None] | None = None
        self._replay_lsn = 0

    def open(self) -> None:
        """Connect and send START_REPLICATION; SourceError names what the server refused."""
        conninfo = session_conninfo(self.dsn, self.app_name, replication="database")
        conn = pq.PGconn.connect(conninfo.encode())
        if conn.status != pq.ConnStatus.OK:
            msg = conn.get_error_message().strip()
            conn.finish()
            error = SourceUnavailableError if transient_libpq_message(msg) else SourceError
            raise error(f"cannot open a replication connection to {safe_dsn(self.dsn)}: {msg}")
        pin_value_encoding(conn, f"replication connection of slot {self.slot!r}")
        lsn = f"{self.start_lsn >> 32:X}/{self.start_lsn & 0xFFFFFFFF:X}"
        pub = self.publication.replace("'", "''")
        streams = self.streaming and conn.server_version >= STREAMING_SERVER_VERSION
        proto = f"proto_version '{PROTO_VERSION}'"
        if streams:
            proto = f"proto_version '{PROTO_VERSION_STREAMING}', streaming 'on'"
        cmd = (
            f'START_REPLICATION SLOT "{self.slot}" LOGICAL {lsn} '
            f"({proto}, publication_names '\"{pub}\"', messages 'true')"
        )
        conn.send_query(cmd.encode())
        res = conn.get_result()
        if res is None or res.status != pq.ExecStatus.COPY_BOTH:
            msg = conn.get_error_message().strip() or (res.error_message.decode() if res else "no result")
            conn.finish()
            if "can no longer get changes" in msg or "invalidated" in msg:
                raise SlotInvalidatedError(
                    f"replication slot {self.slot!r} is invalidated ({msg}). Changes since its last position "
                    "are gone from the WAL: drop it (select pg_drop_replication_slot('"
                    f"{self.slot}')), run ingest again to recreate it, and re-snapshot the tables."
                )
            if "is active for PID" in msg:  # 55006: for a few seconds, the walsender of a run that just ended
                raise SourceUnavailableError(
                    f"replication slot {self.slot!r} is in use by another process ({msg}); if that is not a "
                    "previous run's walsender still exiting, stop the other changelake-ingest (or consumer)"
                )
            error = SourceUnavailableError if transient_libpq_message(msg) else SourceError
            raise error(f"START_REPLICATION on slot {self.slot!r} failed: {msg}")
        conn.nonblocking = 1
        self._conn = conn
        self._streamed = StreamedTransactions(inflight=self.inflight) if streams else None
        self._replay = None

    @property
    def streams(self) -> bool:
        """Whether the open stream has the server stream in-progress transactions (protocol 2)."""
        return self._streamed is not None

    def read(self, timeout_s: float) -> XLogData | DecodedTransaction | Keepalive | None:
        """The next message, or None if none arrived within `timeout_s` seconds."""
        conn = self._conn
        assert conn is not None, "open() first"
        if self._replay is not None:
            item = next(self._replay, None)
            if isinstance(item, bytes):
                return XLogData(self._replay_lsn, self._replay_lsn, item)
            if item is not None:
                return item
            self._replay = None
        streamed = self._streamed
        deadline = None
        absorbing_until = None  # while chunks of streamed transactions are held: when to return anyway
        while True:
            n, data = conn.get_copy_data(1)
            if n > 0:
                self.bytes_received += n
                kind = data[0]
                if kind == MSG_XLOGDATA:
                    start, end, _ = _unpack_xlogdata(data, 1)
                    payload = bytes(data[25:])
                    if streamed is None or (not streamed.in_block and payload[0] not in STREAM_CONTROL):
                        return XLogData(start, end, payload)
                    replay = streamed.take(start, payload)
                    if replay is not None:
                        self._replay, self._replay_lsn = replay, end
                        begin = next(replay)  # the Begin: the rest follow
                        assert isinstance(begin, bytes)
                        return XLogData(end, end, begin)
                    # Held: the caller hears from the server at least every `timeout_s`, so that its
                    # status replies and checks go on while a large transaction's chunks arrive (a
                    # keepalive at position 0 says nothing new).
                    now = time.monotonic()
                    if absorbing_until is None:
                        absorbing_until = now + timeout_s
                    elif now >= absorbing_until:
                        return Keepalive(0, False)
                    continue
                if kind == MSG_KEEPALIVE:
                    end, _, reply = KEEPALIVE.unpack_from(data, 1)
                    oldest = streamed.oldest_start() if streamed is not None else None
                    # The server has sent up to `end`, a streamed transaction still open included:
                    # nothing of it is durable, so the position said stops where it began.
                    return Keepalive(end if oldest is None else min(end, oldest), bool(reply))
                raise SourceError(f"unknown replication message type {bytes([kind])!r} from the server")
            if n == 0:
                if deadline is None:
                    deadline = time.monotonic() + timeout_s
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                ready, _, _ = select.select([conn.socket], [], [], remaining)
                if ready:
                    conn.consume_input()
                continue
            # n == -1: the server ended COPY; n == -2: error
            res = conn.get_result()
            msg = conn.get_error_message().strip() or (res.error_message.decode() if res else "")
            code = res.error_field(pq.DiagnosticField.SQLSTATE) if res is not None else None
            sqlstate = code.decode() if code else None
            # No SQLSTATE: the connection itself was lost. Else the server's code says (a shutdown
            # is transient; a slot invalidated while streaming, 55000, is not).
            error = SourceUnavailableError if sqlstate is None or transient_sqlstate(sqlstate) else SourceError
            raise error(f"replication stream of slot {self.slot!r} ended: {msg or 'server closed it'}")

    def send_status(self, flush_lsn: int, reply: bool = False) -> None:
        """Tell the server everything up to `flush_lsn` is durable (it may advance the slot).

        While a streamed transaction is open the position said stops where it began: nothing of it
        is durable, and a slot confirmed past that start makes the server, after a restart, decode
        the transaction's first part again without being allowed to stream it (it spills to its
        disk). Transactions committed meanwhile are then re-delivered and skipped by position.
        """
        conn = self._conn
        assert conn is not None, "open() first"
        oldest = self._streamed.oldest_start() if self._streamed is not None else None
        if oldest is not None:
            flush_lsn = min(flush_lsn, oldest)
        now_us = int(time.time() * 1_000_000) - PG_EPOCH_OFFSET_US
        msg = STANDBY_STATUS.pack(MSG_STANDBY_STATUS, flush_lsn, flush_lsn, flush_lsn, now_us, int(reply))
        if conn.put_copy_data(msg) != 1:
            raise SourceUnavailableError(f"sending status to the server failed: {conn.get_error_message().strip()}")
        self._flush(conn)

    def _flush(self, conn: pq.abc.PGconn) -> None:
        """Send what libpq has queued; SourceUnavailableError if the connection is gone or stalled."""
        deadline = time.monotonic() + STATUS_SEND_DEADLINE_S
        while (pending := conn.flush()) == 1:
            if time.monotonic() > deadline:  # the peer takes nothing: a stalled path, not a slow one
                raise SourceUnavailableError(
                    f"sending status to the server failed: nothing was taken for {STATUS_SEND_DEADLINE_S:g} s"
                )
            select.select([], [conn.socket], [], 1.0)
        if pending == -1:  # the connection is gone: the server never heard this acknowledgement
            raise SourceUnavailableError(f"sending status to the server failed: {conn.get_error_message().strip()}")

    def close(self) -> None:
        """Close the connection (the slot stays where it was last acknowledged)."""
        if self._conn is not None:
            self._conn.finish()
            self._conn = None
        if self._streamed is not None:
            self._streamed.close()  # the server streams open transactions again from their start
        if self._replay is not None:
            self._replay.close()  # a decoded transaction not read to its end: its rows' file is deleted
        self._replay = None
