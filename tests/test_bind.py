"""Parameters written into a statement as literals (harness.db.bind) give what DuckDB's own binding gives: the same
values, in the places sbench's statements put them, for every plain value; anything else is bound as before."""

from __future__ import annotations

import datetime as dt
import math

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.db.bind import LiteralConnection, Unbindable, bind, literal

TEXT = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")  # what a Python str may send
plain = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**63), max_value=2**63 - 1),
                  st.floats(allow_nan=True, allow_infinity=True), st.text(alphabet=TEXT))


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b and type(a) is type(b)


@settings(max_examples=300, deadline=None)
@given(value=plain)
def test_a_literal_reads_back_as_the_bound_value(value: object) -> None:
    con = duckdb.connect()
    bound = con.execute("SELECT ?", [value]).fetchone()[0]
    written = con.execute(f"SELECT {literal(value)}").fetchone()[0]
    assert _same(bound, written), (value, bound, written)


@settings(max_examples=100, deadline=None)
@given(values=st.lists(st.text(alphabet=TEXT, max_size=8), min_size=1,
                       max_size=5))
def test_a_list_is_a_list_and_quotes_question_marks_and_comments_stay_text(values: list[str]) -> None:
    con = duckdb.connect()
    con.execute("CREATE TABLE t (k VARCHAR, n BIGINT, x DOUBLE)")
    wrapped = LiteralConnection(con)
    for i, v in enumerate(values):
        wrapped.execute("INSERT INTO t VALUES (?, ?, ?) -- a comment with a ? in it", [v, i, i / 3])
    sql = "SELECT k, n, x FROM t WHERE k = ANY(?) AND '?' = '?' /* ? */ ORDER BY n"
    assert wrapped.execute(sql, [values]).fetchall() == con.execute(sql, [values]).fetchall()


def test_what_is_not_plain_is_left_to_the_client() -> None:
    for value in (b"x", {"a": 1}, [], [[1]], [1, "a"], 2**70, "a\x00b", "\ud800"):
        with pytest.raises(Unbindable):
            literal(value)
    with pytest.raises(Unbindable):
        bind("SELECT ?, ?", [1])
    with pytest.raises(Unbindable):
        bind("SELECT ?", [1, 2])
    con = LiteralConnection(duckdb.connect())
    when = dt.datetime(2026, 11, 28, 9, 30)
    assert con.execute("SELECT ?::TIMESTAMP", [when]).fetchone()[0] == when  # bound by the client
    assert con.execute("SELECT $a", {"a": 3}).fetchone()[0] == 3
