"""JSON and JSON-lines content as sbench decodes it, one decoder for every file of a work dir: the runner's
files (collect), a campaign's manifest and a job dir's ``submitted.json`` (``harness.contract.records``).

Pure: bytes in, values and *problems* out (precise, human-readable strings naming the file and the line);
nothing here reads a file (``harness.contract.safefile`` does) or raises on bad content.
"""

from __future__ import annotations

import collections
import json
import operator
from collections.abc import Iterable
from typing import Any

import orjson

# orjson: a C parser, several times faster on the many small runner files; json decides anything it refuses.
_fast_loads = orjson.loads


def decode_json(data: bytes, name: str) -> tuple[Any, str | None]:
    """(document, None), or (None, problem) for content that is not JSON: *name* is the file's name."""
    try:
        return _fast_loads(data), None  # the common case; NaN, huge integers or bad bytes go the slow way
    except (ValueError, RecursionError, TypeError):
        pass
    text = data.decode("utf-8", errors="replace")
    if not text.strip():
        return None, f"{name}: empty file"
    try:
        return json.loads(text), None  # Python's parser: accepts NaN/Infinity (stored as NULL later)
    except RecursionError:
        return None, f"{name}: nested too deeply to be a runner file"
    except json.JSONDecodeError as exc:
        if exc.pos >= len(text.rstrip()) or exc.msg.startswith("Unterminated string"):
            return None, f"{name} line {exc.lineno}: truncated JSON"
        return None, f"{name} line {exc.lineno}: invalid JSON ({exc.msg})"


def _all_have(objs: list[Any], keys: tuple[str, ...]) -> bool:
    """Whether every one of *objs* is a dict holding all *keys* (checked at C speed)."""
    if set(map(type, objs)) - {dict}:
        return False
    if not keys:
        return True
    try:
        collections.deque(map(operator.itemgetter(*keys), objs), maxlen=0)
    except KeyError:
        return False
    return True


def decode_jsonl(data: bytes, name: str, required: Iterable[str] = ()) -> tuple[list[tuple[int, dict[str, Any]]],
                                                                                list[str]]:
    """Objects of JSON-lines content with their line numbers, and a problem per bad line (*name*: the file's).

    A last line without its newline that does not parse is "truncated JSON" (the writer died or is
    still writing); any other line that does not parse is "invalid JSON"; an object without one of the
    *required* keys is "missing" it.
    """
    out: list[tuple[int, dict[str, Any]]] = []
    problems: list[str] = []
    need = tuple(required)
    if data.endswith(b"\n") and b"\n\n" not in data and not data.startswith(b"\n"):
        # Fastest path, the usual file: no blank line, so line i is object i; any doubt -> the paths below.
        try:
            objs = _fast_loads(b"[" + data[:-1].replace(b"\n", b",") + b"]")
        except (ValueError, RecursionError, TypeError):
            objs = None
        if objs is not None and data.count(b"\n") == len(objs) and _all_have(objs, need):
            return list(enumerate(objs, 1)), []
    lines = data.split(b"\n")
    complete_last = data.endswith(b"\n")
    numbered = [(i, raw) for i, raw in enumerate(lines, 1) if raw.strip()]
    if complete_last:
        # Fast path: the whole file as one JSON array (one parser call); any bad line -> line by line.
        try:
            objs = _fast_loads(b"[" + b",".join(raw for _, raw in numbered) + b"]")
        except (ValueError, RecursionError, TypeError):
            try:
                objs = json.loads(b"[" + b",".join(raw for _, raw in numbered) + b"]")
            except (ValueError, RecursionError):
                objs = None
        if objs is not None and len(objs) == len(numbered) and _all_have(objs, need):
            return [(i, o) for (i, _), o in zip(numbered, objs)], []
    for i, raw in numbered:
        is_last_partial = i == len(lines) and not complete_last
        try:
            obj = json.loads(raw.decode("utf-8", errors="replace"))
        except (json.JSONDecodeError, RecursionError):
            problems.append(f"{name} line {i}: {'truncated' if is_last_partial else 'invalid'} JSON")
            continue
        if not isinstance(obj, dict):
            problems.append(f"{name} line {i}: not a JSON object")
            continue
        missing = [k for k in need if k not in obj]
        if missing:
            problems.append(f"{name} line {i}: missing {', '.join(missing)}")
            continue
        out.append((i, obj))
    return out, problems


__all__ = ["decode_json", "decode_jsonl"]
