"""Native libraries' stderr (a delta-rs panic line) goes into the log, not onto the terminal.

delta-rs's Rust threads print a panic (`thread 'tokio-rt-worker' panicked at ...`) with Rust's
default hook straight to file descriptor 2, which Python cannot intercept by replacing
`sys.stderr`. The panic is followed by ingest's own error (the write failed, is retried, and the
command exits with its one-line message), so on the terminal it is only noise that looks like a
crash. The process's fd 2 becomes a pipe whose lines are logged at INFO (shown with `-v`), while
Python's own stderr (the log handler, the CLI's error line) keeps the original descriptor.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading

log = logging.getLogger("ingest.native")

JOIN_AT_EXIT_S = 1.0  # how long the exit waits for native lines still in the pipe to be logged


def route_native_stderr() -> None:
    """Point fd 2 at a pipe read into the log; `sys.stderr` writes to the original stderr from now on.

    For a process ingest owns (the console script, `python -m ingest`): call it before logging is
    configured, whose handler takes `sys.stderr` as it is then. At exit fd 2 is given back and the
    pipe's last lines are logged.
    """
    original = os.dup(2)
    sys.stderr.flush()
    sys.stderr = open(original, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)
    reader = threading.Thread(target=_log_lines, args=(read_end,), name="native-stderr", daemon=True)
    reader.start()

    def give_back() -> None:
        os.dup2(original, 2)  # closes the pipe's last write end: the reader sees its end
        reader.join(JOIN_AT_EXIT_S)

    atexit.register(give_back)


def _log_lines(fd: int) -> None:
    with open(fd, "rb") as pipe:
        for raw in pipe:
            line = raw.decode("utf-8", errors="backslashreplace").rstrip()
            if line:
                log.info("native library output: %s", line)
