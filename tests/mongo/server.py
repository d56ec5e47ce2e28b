"""Starts mongo-java-server (a third-party MongoDB wire-protocol fake) for the MongoDB tests.

Its jars come from `scripts/mongo_java_server.sh` (Maven Central, cached); the launcher
`MongoJavaServerMain.java` next to this file is compiled with javac into a temp dir. The server
has an in-memory backend with its oplog enabled, so change streams work. It is not MongoDB: what
it does not model is listed in docs/mongodb.md.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
LAUNCHER = HERE / "MongoJavaServerMain.java"
START_TIMEOUT_S = 60.0


def jar_dir() -> Path:
    """Resolve (first run: download) the jars; returns their directory."""
    out = subprocess.run(
        ["bash", str(ROOT / "scripts/mongo_java_server.sh")], check=True, capture_output=True, text=True, timeout=600
    )
    return Path(out.stdout.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def mongo_java_server() -> Iterator[str]:
    """Run the server on a free port for the duration; yields its connection URI."""
    if shutil.which("javac") is None or shutil.which("java") is None:
        raise RuntimeError("mongo-java-server tests need a JDK (java and javac, 17+)")
    jars = sorted(str(p) for p in jar_dir().glob("*.jar"))
    with tempfile.TemporaryDirectory(prefix="changelake-mjs-") as classes:
        subprocess.run(["javac", "-d", classes, "-cp", ":".join(jars), str(LAUNCHER)], check=True, timeout=120)
        port = free_port()
        proc = subprocess.Popen(
            ["java", "-Xmx256m", "-cp", ":".join([classes, *jars]), "MongoJavaServerMain", str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line.startswith("READY"):
                raise RuntimeError(f"mongo-java-server did not start (exit {proc.poll()}): {line!r}")
            while time.monotonic() < deadline:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    time.sleep(0.1)
            yield f"mongodb://127.0.0.1:{port}/?directConnection=true"
        finally:
            proc.kill()
            proc.wait(timeout=30)
