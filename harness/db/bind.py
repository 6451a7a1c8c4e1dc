"""Statement parameters written into the SQL as typed literals, instead of bound by DuckDB's Python client.

DuckDB 1.5's Python client imports numpy, pandas and pyarrow the first time it binds any parameter (to check
whether the value is one of theirs): about 0.3 s on every command that opens the database, where a read command
otherwise starts in a tenth of that. :class:`LiteralConnection` wraps a connection so that ``execute(sql,
params)`` with plain values (None, bool, int, float, str, and lists of those) runs the statement with each ``?``
replaced by the value's literal: a string or an integer as an untyped literal (it takes the type its place in the
statement asks for, as a bound parameter does), a float cast to DOUBLE, a list as a list of those: the same
statement, no import. Any other value (a date, a dict of named parameters, a
string holding a NUL) is bound by the client as before.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import duckdb

INT64 = (-(2**63), 2**63 - 1)


class Unbindable(Exception):
    """A value (or statement) this module leaves to the client's own binding."""


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate
        return False
    return True


def literal(value: Any) -> str:
    """*value* as a SQL literal of the type DuckDB's client binds it as."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        if not INT64[0] <= value <= INT64[1]:
            raise Unbindable("an integer beyond BIGINT")
        return str(value) if value >= 0 else f"({value})"
    if isinstance(value, float):
        text = repr(value) if math.isfinite(value) else ("nan" if math.isnan(value) else
                                                        ("inf" if value > 0 else "-inf"))
        return f"CAST('{text}' AS DOUBLE)"
    if isinstance(value, str):
        if "\x00" in value or not _encodes(value):
            raise Unbindable("a string holding NUL, or no UTF-8")
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, (list, tuple)):
        if not value or any(isinstance(v, (list, tuple)) for v in value):
            raise Unbindable("an empty or nested list")
        kinds = {type(v) for v in value if v is not None}
        if len(kinds) > 1:
            raise Unbindable("a list of mixed types")
        return "[" + ", ".join(literal(v) for v in value) + "]"
    raise Unbindable(type(value).__name__)


def bind(sql: str, params: Sequence[Any]) -> str:
    """*sql* with each positional ``?`` (outside quotes and comments) replaced by its value's :func:`literal`;
    :class:`Unbindable` when the placeholders and the values do not match one to one."""
    out: list[str] = []
    values = iter(params)
    used = 0
    i, n = 0, len(sql)
    while i < n:
        ch = sql[i]
        if ch in ("'", '"'):
            end = i + 1
            while end < n:
                if sql[end] == ch:
                    if end + 1 < n and sql[end + 1] == ch:  # a doubled quote inside
                        end += 2
                        continue
                    break
                end += 1
            out.append(sql[i:end + 1])
            i = end + 1
        elif sql.startswith("--", i):
            end = sql.find("\n", i)
            end = n if end < 0 else end
            out.append(sql[i:end])
            i = end
        elif sql.startswith("/*", i):
            end = sql.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append(sql[i:end])
            i = end
        elif ch == "?":
            try:
                out.append(literal(next(values)))
            except StopIteration:
                raise Unbindable("more placeholders than values") from None
            used += 1
            i += 1
        elif ch == "$":
            raise Unbindable("a named or numbered parameter")
        else:
            out.append(ch)
            i += 1
    if used != len(params):
        raise Unbindable("more values than placeholders")
    return "".join(out)


class LiteralConnection:
    """A DuckDB connection whose ``execute`` writes plain parameters into the statement (see the module
    docstring); everything else is the connection's own."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self._con = con

    def execute(self, query: str, parameters: Any = None) -> duckdb.DuckDBPyConnection:
        if parameters is None or isinstance(parameters, dict) or not isinstance(parameters, (list, tuple)):
            return self._con.execute(query) if parameters is None else self._con.execute(query, parameters)
        if not parameters:
            return self._con.execute(query)
        try:
            text = bind(query, parameters)
        except Unbindable:
            return self._con.execute(query, parameters)
        return self._con.execute(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._con, name)


__all__ = ["LiteralConnection", "Unbindable", "bind", "literal"]
