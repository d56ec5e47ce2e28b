"""Log output of the CLI: key=value text or one JSON object a line, both with secrets removed.

The text log's messages already carry their facts as `key=value` tokens (`source=shop lsn=0/1A`);
the JSON format lifts those tokens into fields, so both formats say the same thing. Passwords of
connection strings, and every secret the config holds (DSN and URI passwords, webhook URLs),
are replaced by `***` in the final line of either format, exceptions' text included: a driver
that quotes its connection string in an error cannot leak it through the log.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, Final, Literal
from urllib.parse import unquote, urlsplit

from psycopg.conninfo import conninfo_to_dict

from ingest.config import Config, MongoSource, PostgresSource

LogFormat = Literal["text", "json"]
TEXT_FORMAT: Final = "%(asctime)s level=%(levelname)s logger=%(name)s %(message)s"
MASK: Final = "***"
# Secrets shorter than this are not masked literally (masking every "a" would garble the log);
# the patterns below still catch them where they stand in a connection string.
MIN_SECRET_LEN: Final = 4
# `scheme://user:password@host` and `password=value` / `password='quoted value'` (libpq key=value).
_URI_PASSWORD: Final = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^/\s:@]*:)[^@\s]*(?=@)", re.IGNORECASE)
_KV_PASSWORD: Final = re.compile(r"(?P<head>\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)
_FIELD: Final = re.compile(r"(?<![\w.-])([a-z_][a-z0-9_]*)=('(?:[^'\\]|\\.)*'|\"[^\"]*\"|\S+)")
_RESERVED: Final = frozenset({"ts", "level", "logger", "message", "exc"})
_HANDLER_NAME: Final = "changelake"


class _Redacting(logging.Formatter):
    """A formatter whose final line has connection-string passwords and known secrets masked."""

    def __init__(self, secrets: Iterable[str] = (), fmt: str | None = None) -> None:
        super().__init__(fmt)
        # Longest first: a secret that contains another is masked whole.
        self.secrets = sorted({s for s in secrets if len(s) >= MIN_SECRET_LEN}, key=len, reverse=True)

    def redact(self, text: str) -> str:
        """`text` with every secret and connection-string password replaced by ***."""
        for s in self.secrets:
            text = text.replace(s, MASK)
        text = _URI_PASSWORD.sub(lambda m: m["head"] + MASK, text)
        return _KV_PASSWORD.sub(lambda m: m["head"] + MASK, text)


class TextFormatter(_Redacting):
    """`<time> level=<L> logger=<name> <message>`: the format of the text log."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        """Mask `secrets` in every line."""
        super().__init__(secrets, TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        """The record as one (masked) text line, its traceback after it."""
        return self.redact(super().format(record))


class JsonFormatter(_Redacting):
    """One JSON object a line: ts, level, logger, message, and each `key=value` of the message as a field."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as a JSON object (masked); a traceback goes in `exc`."""
        message = self.redact(record.getMessage())
        doc: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": message,
        }
        for key, raw in _FIELD.findall(message):
            doc.setdefault(f"field_{key}" if key in _RESERVED else key, _value(raw))
        if record.exc_info:
            doc["exc"] = self.redact(self.formatException(record.exc_info))
        return json.dumps(doc, ensure_ascii=False, default=str)


def _value(raw: str) -> Any:
    """A field's value: an integer or a number when it is one, else the text without its quotes."""
    if raw[:1] in "'\"" and raw[-1:] == raw[:1] and len(raw) > 1:
        return raw[1:-1]
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    return raw


def secrets_of(cfg: Config) -> list[str]:
    """Every secret the config holds: DSN and URI passwords (raw and decoded), webhook URLs."""
    out: list[str] = []
    for src in cfg.sources:
        if isinstance(src, PostgresSource):
            password = conninfo_to_dict(src.dsn).get("password")
            if password:
                out += [str(password)]
            out += _uri_password(src.dsn)
        elif isinstance(src, MongoSource):
            out += _uri_password(src.uri)
    if cfg.alerts.webhook is not None:
        out.append(cfg.alerts.webhook.url)
    return out


def _uri_password(uri: str) -> list[str]:
    if "://" not in uri:
        return []
    try:
        password = urlsplit(uri).password
    except ValueError:
        return []
    return [password, unquote(password)] if password else []


_masking: _Redacting = _Redacting()  # the secrets of the last `configure`, for `redact`


def redact(text: str) -> str:
    """`text` masked as the log is: for what the CLI prints on stderr outside the log (its error line)."""
    return _masking.redact(text)


def configure(level: int, fmt: LogFormat = "text", secrets: Iterable[str] = ()) -> None:
    """Log records at `level` and above to stderr in `fmt`, masking `secrets`.

    Called again (after the config is read) it replaces its own handler; like logging.basicConfig
    it leaves a root logger that someone else configured (pytest's capture) alone.
    """
    global _masking
    _masking = _Redacting(secrets)
    root = logging.getLogger()
    ours = [h for h in root.handlers if h.get_name() == _HANDLER_NAME]
    if root.handlers and not ours:
        return
    for h in ours:
        root.removeHandler(h)
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(JsonFormatter(secrets) if fmt == "json" else TextFormatter(secrets))
    root.addHandler(handler)
    root.setLevel(level)
