"""Small, explicit checks for YAML documents.

Every message names the file, the line where known, the dotted key and what
would fix it: ``inventory/x.yaml:12: partitions.a100.gpus_per_node must be an
integer >= 0, got 'eight'``.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any, NoReturn

from .errors import InputError
from .yamlio import LineDict


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class Checker:
    """Raises ``error`` with file/line/key context."""

    def __init__(self, source: str, error: type[InputError]) -> None:
        self.source = source
        self.error = error

    def fail(self, key: str, message: str, node: Any = None, leaf: str | None = None) -> NoReturn:
        line = None
        if isinstance(node, LineDict):
            line = node.lines.get(leaf) if leaf is not None else None
            if line is None:
                line = node.start_line or None
        where = f"{self.source}:{line}" if line else self.source
        raise self.error(f"{where}: {key} {message}")

    # -- structure ---------------------------------------------------------
    def mapping(self, value: Any, key: str, parent: Any = None, leaf: str | None = None) -> Mapping[str, Any]:
        if value is None:
            return LineDict()
        if not isinstance(value, Mapping):
            self.fail(key, f"must be a mapping (key: value), got {_show(value)}", parent, leaf)
        return value

    def known_keys(self, node: Mapping[str, Any], key: str, allowed: Iterable[str]) -> None:
        allowed = list(allowed)
        for k in node:
            if k not in allowed:
                close = difflib.get_close_matches(str(k), allowed, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                dotted = f"{key}.{k}" if key else str(k)
                self.fail(dotted, f"is not a known key; {hint}valid keys: {', '.join(allowed)}", node, k)

    def require(self, node: Mapping[str, Any], key: str, name: str, hint: str = "") -> Any:
        if name not in node or node[name] is None:
            dotted = f"{key}.{name}" if key else name
            extra = f" ({hint})" if hint else ""
            self.fail(dotted, f"is required but missing{extra}", node)
        return node[name]

    # -- scalars -----------------------------------------------------------
    def string(self, node: Mapping[str, Any], key: str, name: str, default: Any = None, nonempty: bool = True) -> Any:
        value = node.get(name, default)
        if value is None:
            return default
        dotted = f"{key}.{name}" if key else name
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            self.fail(dotted, f"must be a string, got {_show(value)}", node, name)
        value = str(value)
        if nonempty and not value.strip():
            self.fail(dotted, "must not be empty", node, name)
        return value

    def integer(self, node: Mapping[str, Any], key: str, name: str, default: Any = None, minimum: int | None = None) -> Any:
        value = node.get(name, default)
        if value is None:
            return default
        dotted = f"{key}.{name}" if key else name
        bound = f" >= {minimum}" if minimum is not None else ""
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, str) and value.strip().lstrip("-").isdigit():
                value = int(value)
            else:
                self.fail(dotted, f"must be an integer{bound}, got {_show(value)}", node, name)
        if minimum is not None and value < minimum:
            self.fail(dotted, f"must be an integer{bound}, got {value}", node, name)
        return value

    def number(self, node: Mapping[str, Any], key: str, name: str, default: Any = None, minimum: float | None = None) -> Any:
        value = node.get(name, default)
        if value is None:
            return default
        dotted = f"{key}.{name}" if key else name
        bound = f" >= {minimum}" if minimum is not None else ""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(dotted, f"must be a number{bound}, got {_show(value)}", node, name)
        if minimum is not None and value < minimum:
            self.fail(dotted, f"must be a number{bound}, got {value}", node, name)
        return value

    def boolean(self, node: Mapping[str, Any], key: str, name: str, default: Any = None) -> Any:
        value = node.get(name, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            dotted = f"{key}.{name}" if key else name
            self.fail(dotted, f"must be true or false, got {_show(value)}", node, name)
        return value

    def string_list(self, node: Mapping[str, Any], key: str, name: str, default: Any = None) -> Any:
        value = node.get(name, default)
        if value is None:
            return default
        dotted = f"{key}.{name}" if key else name
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in value):
            self.fail(dotted, f"must be a list of strings, got {_show(value)}", node, name)
        return [str(v) for v in value]

    def string_map(self, node: Mapping[str, Any], key: str, name: str) -> dict[str, str]:
        value = node.get(name)
        dotted = f"{key}.{name}" if key else name
        if value is None:
            return {}
        value = self.mapping(value, dotted, node, name)
        out: dict[str, str] = {}
        for k, v in value.items():
            if isinstance(v, bool):
                v = "1" if v else "0"
            if not isinstance(v, (str, int, float)):
                self.fail(f"{dotted}.{k}", f"must be a string, got {_show(v)}", value, k)
            out[str(k)] = str(v)
        return out
