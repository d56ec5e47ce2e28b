"""A TCP proxy between ingest and a source that a test can cut or blackhole (issue 20 fault tests).

toxiproxy is not installable from the registries this project uses, so this is the small asyncio
proxy the issue allows: it forwards bytes both ways, and on request drops every connection
(`cut`: the peer sees a reset at once) or stops forwarding while keeping the connections open
(`blackhole`: packets vanish, as on a broken network path, until `heal`).

It runs in a process of its own: libpq's blocking connect holds the GIL, so a proxy thread in the
test's process would never answer an in-process capture's connection.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

CHUNK = 65536


class TcpProxy:
    """Owns the proxy process; `port` is where it listens on 127.0.0.1."""

    def __init__(self, target_host: str, target_port: int) -> None:
        """Start the proxy process and wait for its port."""
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__)), target_host, str(target_port)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())

    def _signal(self, sig: signal.Signals) -> None:
        os.kill(self.proc.pid, sig)

    def cut(self) -> None:
        """Drop every connection through the proxy now (new ones are accepted)."""
        self._signal(signal.SIGHUP)

    def blackhole(self) -> None:
        """Stop forwarding in both directions, keeping the connections open."""
        self._signal(signal.SIGUSR1)

    def heal(self) -> None:
        """Forward again (bytes held during the blackhole go through, as TCP retransmits them)."""
        self._signal(signal.SIGUSR2)

    def close(self) -> None:
        """Stop the proxy."""
        self.proc.terminate()
        self.proc.wait(timeout=10)


async def _main(target: tuple[str, int]) -> None:
    open_ = asyncio.Event()
    open_.set()
    writers: set[asyncio.StreamWriter] = set()

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            data = await reader.read(CHUNK)
            await open_.wait()  # blackholed: hold the bytes, forward nothing
            if not data:
                writer.close()
                return
            writer.write(data)
            await writer.drain()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*target)
        except OSError:
            writer.close()
            return
        writers.update((writer, up_writer))
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer), return_exceptions=True)
        for w in (writer, up_writer):
            writers.discard(w)
            w.close()

    def cut() -> None:
        for w in list(writers):
            w.transport.abort()  # a reset, not an orderly close
        writers.clear()

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, open_.clear)
    loop.add_signal_handler(signal.SIGUSR2, open_.set)
    loop.add_signal_handler(signal.SIGHUP, cut)
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(_main((sys.argv[1], int(sys.argv[2]))))
