"""Rows (Python dicts) as typed columns that DuckDB scans in one statement: each value converted to its
column's type, or NULL when it cannot be one (a runner file with a string where a number belongs must not
abort a collect). Pure Python, numpy and a pandas frame over the arrays: staging needs no database, so collect
stages while DuckDB loads."""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .schema import COLUMN_NAMES, SCHEMA
from .values import AS_IS, COERCE, INT_RANGE, epochs

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd


def _column(values: Sequence[Any], sql_type: str) -> np.ndarray:
    if sql_type == "TIMESTAMP" and values and (stamps := epochs(values)) is not None:
        return stamps
    import numpy as np  # heavy: only a writer stages rows; readers (status, report, query) start without it

    conv = COERCE[sql_type]
    arr = np.empty(len(values), dtype=object)
    same = AS_IS.get(sql_type)
    if same is not None:
        arr[:] = [v if v.__class__ is same else None if v is None else conv(v) for v in values]
    elif sql_type == "VARCHAR":  # the common case inlined: plain ASCII text without NUL is stored as is
        arr[:] = [v if v.__class__ is str and v.isascii() and "\0" not in v else None if v is None else conv(v)
                  for v in values]
    elif sql_type in INT_RANGE:  # an int in the column's range is stored as is
        lo, hi = -INT_RANGE[sql_type], INT_RANGE[sql_type]
        arr[:] = [v if v.__class__ is int and lo <= v < hi else None if v is None else conv(v) for v in values]
    else:
        arr[:] = [None if v is None else conv(v) for v in values]
    return arr


def _transpose(names: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> tuple[list[Sequence[Any]], bool]:
    """The values of each of *names* in *rows* (a missing key is None), and whether every row has exactly
    these keys (then the transposition ran at C speed: itemgetter found them all and the counts add up)."""
    if not rows:
        return [[] for _ in names], True
    try:
        values: list[Sequence[Any]] = list(zip(*map(operator.itemgetter(*names), rows))) if len(names) > 1 else \
            [[r[names[0]] for r in rows]]
        return values, sum(map(len, rows)) == len(rows) * len(names)
    except KeyError:
        return [[r.get(c) for r in rows] for c in names], False


def frame(columns: Sequence[tuple[str, str]], rows: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Rows as typed arrays, one per column, in a pandas frame DuckDB scans directly (no row loop)."""
    return typed(columns, rows)


@dataclass
class Staged:
    """Rows of one table as typed columns (:func:`frame`'s arrays), ready for :meth:`Store.insert`."""

    table: str
    rows: int
    columns: Any


def check_keys(table: str, rows: Sequence[Mapping[str, Any]]) -> None:
    """Refuse a row with a key that is no column of *table*: a misspelled key would otherwise be a NULL
    nobody notices. A programming error, so it is loud (ValueError), not a warning."""
    known = COLUMN_NAMES[table]
    shapes: set[tuple[str, ...]] = set()
    for r in rows:
        shape = tuple(r)
        if shape in shapes:
            continue
        shapes.add(shape)
        unknown = [k for k in shape if k not in known]
        if unknown:
            raise ValueError(f"{table}: row with unknown column(s) {', '.join(map(repr, unknown))}")


def stage(table: str, rows: Sequence[Mapping[str, Any]]) -> Staged:
    """Convert *rows* for :meth:`Store.insert` into *table*; pure Python, no database (so it can be done
    while the connection is busy elsewhere). A key that is no column of *table* raises ValueError."""
    if not rows:
        return Staged(table, 0, {})
    return Staged(table, len(rows), typed(SCHEMA[table], rows, table))


def typed(columns: Sequence[tuple[str, str]], rows: Sequence[Mapping[str, Any]],
          table: str | None = None) -> pd.DataFrame:
    """*rows* (holding these *columns*; missing keys are NULL) as :func:`frame`'s typed arrays. With *table*,
    a key that is no column of it raises ValueError."""
    values, exact = _transpose([c for c, _ in columns], rows)
    if not exact and table is not None:
        check_keys(table, rows)
    # A pandas frame over the arrays (no copy): DuckDB 1.5 scans a dict of numpy arrays through pandas's API all the
    # same (importing it), and then fails on an object column whose sampled values are all None unless it is a
    # Series (``first_valid_index``).
    import pandas as pd  # heavy: only a writer stages rows

    arrays = {c: _column(v, t) for (c, t), v in zip(columns, values)}
    # dtype kept as it is: pandas 3 would otherwise read an object array of text as its str dtype (None as NaN)
    return pd.DataFrame({c: pd.Series(a, dtype=a.dtype, copy=False) for c, a in arrays.items()}, copy=False)
