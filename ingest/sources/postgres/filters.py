"""A filtered snapshot's SQL predicate: checked to be one expression, and wrapped for a page's query.

The predicate is an operator's SQL text. It only ever runs inside READ ONLY transactions (the
check's EXPLAIN and the pages' reads), never in the watermark's transaction or anything else
that writes. Before a request is queued it must be one expression: a `)` that closes a
parenthesis it did not open (`true) or (true`) would rewrite the page's own conditions around it,
and a `;` would start another statement. Quotes, dollar quotes and comments are skipped the way
PostgreSQL's lexer skips them, so a `)` inside a string literal is not counted.
"""

from __future__ import annotations

import re

from psycopg import sql

_DOLLAR_TAG = re.compile(r"\$(?:[A-Za-z_\x80-\uffff][A-Za-z0-9_\x80-\uffff]*)?\$")
_IDENT_CHAR = re.compile(r"[A-Za-z0-9_$\x80-\uffff]")


def filter_sql(where: str) -> sql.Composable:
    """The predicate as a condition of a page's query: parenthesized, on lines of its own.

    The newlines end a `--` comment the predicate may close with, so it cannot hide what follows.
    """
    return sql.SQL("(\n" + where + "\n)")


def _skip_quoted(text: str, i: int) -> int | None:
    """The index after the quoted literal or identifier that starts at `i`; None if it never ends."""
    quote = text[i]
    # E'...' strings take backslash escapes; standard strings and identifiers only doubled quotes.
    escapes = quote == "'" and i > 0 and text[i - 1] in "eE" and (i < 2 or not _IDENT_CHAR.match(text[i - 2]))
    j = i + 1
    while j < len(text):
        if escapes and text[j] == "\\":
            j += 2
            continue
        if text[j] == quote:
            if j + 1 < len(text) and text[j + 1] == quote:
                j += 2
                continue
            return j + 1
        j += 1
    return None


def _skip_comment(text: str, i: int) -> int | None:
    """The index after the (nestable) block comment that starts at `i`; None if it never ends."""
    depth, j = 0, i
    while j < len(text):
        if text.startswith("/*", j):
            depth, j = depth + 1, j + 2
        elif text.startswith("*/", j):
            depth, j = depth - 1, j + 2
            if depth == 0:
                return j
        else:
            j += 1
    return None


def _skip_token(text: str, i: int) -> int | str | None:
    """Where a comment or quoted token starting at `i` ends, what is wrong with it, or None if none starts."""
    c = text[i]
    if text.startswith("--", i):
        newline = text.find("\n", i)
        return len(text) if newline < 0 else newline + 1
    if text.startswith("/*", i):
        end = _skip_comment(text, i)
        return "a /* comment is never closed" if end is None else end
    if c in "'\"":
        end = _skip_quoted(text, i)
        return f"a {c} quote is never closed" if end is None else end
    if c == "$" and (i == 0 or not _IDENT_CHAR.match(text[i - 1])) and (m := _DOLLAR_TAG.match(text, i)):
        close = text.find(m.group(0), m.end())
        return f"a {m.group(0)} quote is never closed" if close < 0 else close + len(m.group(0))
    return None


def predicate_problem(where: str) -> str | None:
    """Why `where` is not one SQL expression a page can add to its conditions, or None.

    Only the shape is checked here (one expression, no statement separator, nothing left open);
    whether it parses, names existing columns and is boolean is the server's to say (EXPLAIN).
    """
    if not where.strip():
        return "the predicate is empty"
    depth, i = 0, 0
    while i < len(where):
        skipped = _skip_token(where, i)
        if isinstance(skipped, str):
            return skipped
        if skipped is not None:
            i = skipped
            continue
        c = where[i]
        if c == ";":
            return "it holds a ';': give one predicate, not statements"
        depth += {"(": 1, ")": -1}.get(c, 0)
        if depth < 0:
            return "it closes a parenthesis it did not open"
        i += 1
    return "it leaves a parenthesis open" if depth else None
