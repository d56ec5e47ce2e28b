"""A panic of the compiled decoder becomes what its callers already handle: a refusal, said once in one line.

PyO3 raises a Rust panic as `pyo3_runtime.PanicException`, a BaseException, so no `except
Exception` (nor the CLI's one-line error) catches it: a bug in the compiled decoder would end the
run with a Python traceback. Every caller of the compiled decoder already hands a refused input
(ValueError) to the Python decoder, the reference it mirrors, which gives the same output or
raises the error that names the table and column. So a panic is refused the same way, with one
warning per relation naming the table; the run goes on, at Python's speed for that input.

A snapshot page's buffers (`page`, `push_rows`, `buffers`) have no Python twin to hand a panic
to: there a panic is that ValueError, which fails the page with the message naming the table.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Final

log = logging.getLogger(__name__)

PANIC_TYPE: Final = ("pyo3_runtime", "PanicException")  # (module, name): PyO3 does not export the class


def is_panic(error: BaseException) -> bool:
    """Whether `error` is a Rust panic raised through PyO3."""
    return (type(error).__module__, type(error).__name__) == PANIC_TYPE


class GuardedEncoder:
    """One relation's compiled RowEncoder whose panics are refusals.

    Responsibilities: forward `change`, `copy_rows_of`, `copy_page_of` and a snapshot page's
    calls (`page`, `copy_into`, `push_rows`, `buffers`); turn a panic into ValueError naming the
    table (`what`); warn once per relation, in one line, that it happened.
    The stream's per-row caller (ChangeBuilder.feed_payload) calls `unguarded_change` and guards it
    itself with `refusal`: a forwarding Python frame per row cost more than the try it saves.
    """

    __slots__ = ("_enc", "_warned", "_what", "unguarded_change")

    def __init__(self, encoder: Any, what: str) -> None:
        """Guard `encoder`; `what` names its relation (`schema.table`, or its columns) in errors."""
        self._enc, self._what, self._warned = encoder, what, False
        self.unguarded_change = encoder.change  # RowEncoder.change itself: its caller handles a panic (`refusal`)

    def change(self, payload: bytes) -> Any:
        """RowEncoder.change; a panic raises ValueError. Called per row: the guard inlined, not `_call`."""
        try:
            return self._enc.change(payload)
        except ValueError:
            raise
        except BaseException as e:
            raise self.refusal(e) from None

    def copy_rows_of(self, buf: bytes) -> Any:
        """RowEncoder.copy_rows_of; a panic raises ValueError."""
        return self._call(self._enc.copy_rows_of, buf)

    def copy_page_of(self, buf: bytes) -> Any:
        """RowEncoder.copy_page_of; a panic raises ValueError."""
        return self._call(self._enc.copy_page_of, buf)

    def page(self) -> Any:
        """RowEncoder.page: an empty snapshot page (a PageBuilder) of this relation; a panic raises ValueError."""
        return self._call(self._enc.page)

    def copy_into(self, page: Any, buf: bytes, max_chars: int) -> bool:
        """RowEncoder.copy_into: `buf`'s COPY rows appended to `page`; whether the page's budget cut it.

        A panic raises ValueError. After a refusal or a panic the page holds the rows it had before
        the call (native/).
        """
        return bool(self._call(self._enc.copy_into, page, buf, max_chars))

    def push_rows(self, page: Any, rows: list[tuple[str, str, tuple[str, ...]]], max_chars: int) -> bool:
        """PageBuilder.push_rows: rows Python encoded appended to `page`, whether the budget cut it."""
        return bool(self._call(page.push_rows, rows, max_chars))

    def buffers(self, page: Any) -> Any:
        """PageBuilder.buffers: the page's row count, record characters, Arrow buffers and last key."""
        return self._call(page.buffers)

    def _call(self, method: Callable[..., Any], *args: Any) -> Any:
        try:
            return method(*args)
        except ValueError:
            raise
        except BaseException as e:
            raise self.refusal(e) from None

    def refusal(self, error: BaseException) -> BaseException:
        """What `error` raised by the compiled decoder becomes: a panic a ValueError (warned once), else itself."""
        if not is_panic(error):
            return error  # KeyboardInterrupt, MemoryError ...: as they were
        detail = " ".join(str(error).split())  # one line, whatever the panic message holds
        if not self._warned:
            self._warned = True
            log.warning(
                "the compiled decoder panicked on %s (%s): a bug in native/, please report it; this relation's "
                "rows it fails on are decoded in Python (same output, slower)",
                self._what,
                detail,
            )
        return ValueError(f"compiled decoder panicked on {self._what}: {detail}")
