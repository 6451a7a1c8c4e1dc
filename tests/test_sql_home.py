"""``harness.db`` holds every SQL statement (docs/architecture.md): no module of ``harness/`` outside ``db/`` has a
string that looks like one. Each module is parsed, not imported; a string is its text as written (an f-string with
``{}`` for each value, a ``+`` of strings joined), so a statement split over an f-string or a concatenation is
found too. A breach names the file and the line."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

HARNESS = Path(__file__).resolve().parents[1] / "harness"

# A statement's first words, not just the keyword: prose ("With --preflight: ...", "Update steps ...") and a
# Vega-Lite "select" are no SQL.
SQL = re.compile(
    r"""\s*(?:
        select\s+(?:distinct\s+)?(?:\*|\d|\{\}|[\w.]+\s*,|.*?\bfrom\b)
      | insert\s+(?:or\s+\w+\s+)?into\b
      | update\s+\S+\s+set\b
      | delete\s+from\b
      | with\s+(?:recursive\s+)?\w+(?:\s*\([^)]*\))?\s+as\s*(?:\(|(?:not\s+)?materialized\b)
      | create\s+(?:or\s+replace\s+)?(?:temp\w*\s+|unique\s+)?(?:table|view|index|sequence|schema|macro|type)\b
    )""", re.IGNORECASE | re.DOTALL | re.VERBOSE)


def _text(node: ast.AST) -> str | None:
    """A string expression's text as written (``{}`` for an f-string's values); None for anything else."""
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else None
    if isinstance(node, ast.JoinedStr):
        return "".join(_text(v) or "{}" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _text(node.left), _text(node.right)
        return None if left is None and right is None else (left or "{}") + (right or "{}")
    return None


def sql_strings(source: str) -> list[tuple[int, str]]:
    """(line, text) of each string in *source* that looks like a SQL statement."""
    found: dict[int, str] = {}
    for node in ast.walk(ast.parse(source)):
        text = _text(node)
        if text is not None and SQL.match(text):
            found.setdefault(node.lineno, text)
    return sorted(found.items())


def test_the_detector_finds_statements_and_passes_prose() -> None:
    statements = ["SELECT count(*) FROM runs", "  select run_id\n  from runs", "SELECT 1", "SELECT * FROM t",
                  "SELECT a, b", "INSERT INTO t VALUES (?)", "insert or replace into t VALUES (1)",
                  "UPDATE runs SET x = 1", "DELETE FROM runs", "WITH t AS (SELECT 1) SELECT * FROM t",
                  "with recursive r(n) as (select 1)", "CREATE TABLE t (x INT)", "CREATE OR REPLACE VIEW v AS 1"]
    for s in statements:
        assert sql_strings(repr(s)), s
    assert sql_strings('x = f"SELECT {cols} FROM {table}"')
    assert sql_strings('x = "SELECT r.a, " + "r.b FROM runs r"')
    assert sql_strings('x = ("WITH t AS (SELECT 1) "\n     "SELECT * FROM t")') == [(1, "WITH t AS (SELECT 1) "
                                                                                        "SELECT * FROM t")]
    prose = ["With --preflight: leave the hosts of slow devices out", "Update steps to accumulate before a pass",
             "select", " with one measurements column", "Select the campaign", "Delete it: sbench cancel",
             "Create a sweep first", 'run sbench query "SELECT run_id FROM runs"']
    for s in prose:
        assert not sql_strings(repr(s)), s


@pytest.mark.parametrize("path", sorted(p for p in HARNESS.rglob("*.py") if p.relative_to(HARNESS).parts[0] != "db"),
                         ids=lambda p: str(p.relative_to(HARNESS.parent)))
def test_no_sql_outside_db(path: Path) -> None:
    found = sql_strings(path.read_text(encoding="utf-8"))
    where = HARNESS.parent
    assert not found, "SQL belongs in harness/db/ (one module per reader or writer):\n" + "\n".join(
        f"{path.relative_to(where)}:{line}: {text.strip()[:80]!r}" for line, text in found)
