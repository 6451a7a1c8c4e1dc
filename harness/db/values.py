"""Python values as the results database stores them: each column type's conversion (NULL for a value that
does not fit, never an error), epoch seconds and ISO text as UTC timestamps, JSON text DuckDB accepts (and a JSON
column's value read back: :func:`from_json`), and entity values as their typed columns."""

from __future__ import annotations

import datetime as _dt
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson

from .schema import ENTITY_COLUMNS

if TYPE_CHECKING:
    import numpy as np

INT_RANGE = {"INTEGER": 2**31, "BIGINT": 2**63}


def to_int(v: Any, bits: str = "BIGINT") -> int | None:
    """An integer that fits the column (INTEGER or BIGINT); None for anything else, so one out-of-range
    value in a file can never abort a collect."""
    if isinstance(v, bool):
        return int(v)
    if not isinstance(v, int):
        try:
            f = float(v)
        except (TypeError, ValueError, OverflowError):
            return None
        if not f.is_integer():  # also NaN and infinity
            return None
        v = int(f)
    limit = INT_RANGE[bits]
    return v if -limit <= v < limit else None


def to_float(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    try:
        return float(v)
    except (TypeError, ValueError, OverflowError):
        return None


def to_str(v: Any) -> str:
    """Text DuckDB accepts: no NUL, valid UTF-8 (lone surrogates from a JSON file become U+FFFD)."""
    text = v if isinstance(v, str) else str(v)
    if text.isascii() and "\0" not in text:
        return text  # the common case, checked at C speed
    if "\0" in text:
        text = text.replace("\0", "\\0")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text


def _finite(value: Any) -> Any:
    """*value* with every non-finite float replaced by None (JSON has no NaN or infinity)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _to_bool(v: Any) -> bool | None:
    if isinstance(v, str):
        return {"true": True, "false": False}.get(v.lower())
    return bool(v) if isinstance(v, (bool, int)) else None


def _to_list(v: Any) -> list[str] | None:
    return [to_str(x) for x in v] if isinstance(v, (list, tuple)) else None


def _to_ts(v: Any) -> _dt.datetime | None:
    return v if isinstance(v, _dt.datetime) else utc(v)


# Python values -> the column's type; anything that does not fit (a runner file with a string where a
# number belongs) becomes NULL rather than aborting the whole collect.
COERCE: dict[str, Callable[[Any], Any]] = {"VARCHAR": to_str,
           "JSON": lambda v: v if isinstance(v, JsonText) else _json_text(v) if isinstance(v, str) else to_json(v),
           "BIGINT": to_int, "INTEGER": lambda v: to_int(v, "INTEGER"),
           "DOUBLE": to_float, "BOOLEAN": _to_bool, "VARCHAR[]": _to_list, "TIMESTAMP": _to_ts}


def _json_text(text: str) -> str | None:
    """A JSON column's text as DuckDB will parse it: re-encoded when Python's parser had to accept
    NaN/Infinity, None when it is no JSON at all."""
    try:
        return to_json(json.loads(text))
    except (ValueError, RecursionError):
        return None


def epochs(values: Sequence[Any]) -> np.ndarray | None:
    """Epoch seconds (every value a float or None) as datetime64[us] (None: NaT), rounded as :func:`utc`
    rounds them (to the nearest microsecond, half to even) but in one vector operation; None when a value
    is anything else or outside 1970-5138."""
    if not set(map(type, values)) <= {float, type(None)}:
        return None
    import numpy as np  # heavy: only a writer stages timestamps; readers (status, report, query) start without it

    x = np.array([np.nan if v is None else v for v in values] if None in values else values, dtype=np.float64)
    missing = np.isnan(x)
    x[missing] = 0.0
    if not bool(np.all((x >= 0.0) & (x < 1e11))):
        return None
    whole = np.floor(x)
    micros = whole.astype(np.int64) * 1_000_000 + np.rint((x - whole) * 1e6).astype(np.int64)
    out = micros.astype("datetime64[us]")
    out[missing] = np.datetime64("NaT")
    return out


_EPOCH = _dt.datetime(1970, 1, 1)


def utc(value: Any) -> _dt.datetime | None:
    """An epoch number or ISO-8601 string as a naive UTC datetime (the DB stores TIMESTAMP in UTC)."""
    if value is None or value == "":
        return None
    try:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return _EPOCH + _dt.timedelta(seconds=float(value))  # = fromtimestamp(utc), 2.5x faster
        if isinstance(value, _dt.datetime):
            d = value
        else:
            d = _dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        if d.tzinfo is not None:
            d = d.astimezone(_dt.timezone.utc).replace(tzinfo=None)
        return d
    except (ValueError, OverflowError, OSError):
        return None


def coerce_entity_value(kind_sql: str, value: Any) -> Any:
    """An entity value in its column's type (None when it cannot be one)."""
    if value is None:
        return None
    try:
        if kind_sql == "BIGINT":
            return None if isinstance(value, bool) else to_int(value)
        if kind_sql == "DOUBLE":
            return None if isinstance(value, bool) else to_float(value)
        if kind_sql == "BOOLEAN":
            if isinstance(value, str):
                return {"true": True, "false": False}.get(value.lower())
            return bool(value)
        if kind_sql == "VARCHAR[]":
            if isinstance(value, str):
                return [to_str(v) for v in value.split()]
            return [to_str(v) for v in value]
        return to_str(value)
    except (TypeError, ValueError):
        return None


def entity_values(entity: Mapping[str, Any] | None) -> dict[str, Any]:
    entity = entity or {}
    return {name: coerce_entity_value(sql, entity.get(name)) for name, sql in ENTITY_COLUMNS}


class JsonText(str):
    """Text :func:`to_json` made: already what a JSON column accepts (not parsed again when stored)."""

    __slots__ = ()


# Values already of the column's Python type need no conversion (checked by exact class: bool is an int).
AS_IS = {"DOUBLE": float, "TIMESTAMP": _dt.datetime, "BOOLEAN": bool, "JSON": JsonText}


_ORJSON_OPTS = (orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS | orjson.OPT_PASSTHROUGH_DATETIME
                | orjson.OPT_PASSTHROUGH_DATACLASS)


def to_json(value: Any) -> str | None:
    """JSON text DuckDB's JSON type accepts: non-finite floats become null, keys strings, text valid."""
    if value is None:
        return None
    try:  # the common case (NaN/infinity become null, as below); lone surrogates or huge ints fall through
        return JsonText(orjson.dumps(value, default=str, option=_ORJSON_OPTS).decode())
    except (TypeError, orjson.JSONEncodeError):
        pass
    try:
        return JsonText(to_str(json.dumps(value, sort_keys=True, default=str, allow_nan=False)))
    except ValueError:
        return JsonText(to_str(json.dumps(_finite(value), sort_keys=True, default=str, allow_nan=False)))
    except (TypeError, RecursionError):
        return None


def from_json(value: Any, default: Any = None) -> Any:
    """A JSON column's value as Python, the one reader of every JSON value the database holds: its text decoded
    (Python's parser, which keeps an integer of any size an integer, as :func:`to_json` wrote it); a value DuckDB
    already decoded (a dict, a list) as it is; *default* for NULL, empty text and text that is no JSON."""
    if value is None:
        return default
    if not isinstance(value, (str, bytes)):
        return value
    try:
        return json.loads(value)
    except (ValueError, RecursionError):
        return default


def key_int(value: Any, name: str) -> int:
    """A repeat/attempt/task number of a manifest line: an INTEGER, or ``ValueError`` (the line is
    reported as malformed instead of aborting the collect)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"{name} must be an integer, got {value!r}"[:200])
    n = int(value)
    if not 0 <= n < 2**31:
        raise ValueError(f"{name} must be an integer in [0, 2^31), got {str(value)[:40]}")
    return n
