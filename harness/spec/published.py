"""The reference's published measurements in sbench's terms: ado's CSV format (the data sets
``ibm-research/LLMFineTuningBench`` and ``ibm-research/LLM_Fine-Tuning_Performance``, which ado's replay
actuator reads), one row per measurement, its columns ado's entity and property names.

:func:`parse_row` turns one row into a :class:`PublishedRow`: the experiment its ``method`` names
(:data:`METHODS`), the entity fields the row gives (``tokens_per_sample`` is ``model_max_length``:
:data:`RENAMED`), ``is_valid``, the measured properties sbench has columns for, and every other column
unchanged in ``extra``. A row that does not parse raises ``ValueError`` with the reason; nothing is guessed: a
method, a number or a boolean that is not spelled as :data:`METHODS`, a number or ``True``/``False``/``1``/``0``
makes the row unreadable. An empty cell (or ``nan``, ``None``) is a value the row does not give.

A published point has only the fields its file gives, so it is matched with a measured point on those
(:func:`matches`): every field the row gives equals the point's value (``fms_hf_tuning_version`` only where the
point ran fms-hf-tuning: sbench's own trainer runs no release of it). ``compare`` and ``check``
(``references: {from_campaign: NAME}``) pair points that way.
"""

from __future__ import annotations

import ast
import functools
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.contract.errors import InputError

from .catalog import BENCHMARK_PROPERTIES, DERIVED_PROPERTIES, EXPERIMENTS, STABILITY_PROPERTIES, Experiment

# The method column's spellings (case-insensitive) -> the benchmark experiment; an experiment id names itself.
METHODS: dict[str, str] = {
    **{exp.method: exp.id for exp in EXPERIMENTS.values() if exp.id.endswith("_benchmark-v1.0.0")},
    "gtpq-lora": "finetune_gtpq-lora_benchmark-v1.0.0",  # the reference's own spelling of its GPTQ experiment
    **{exp.id.lower(): exp.id for exp in EXPERIMENTS.values()},
    "finetune_gptq-lora_benchmark-v1.0.0": "finetune_gtpq-lora_benchmark-v1.0.0",
}
RENAMED = {"tokens_per_sample": "model_max_length"}  # published column -> sbench's entity field
METHOD = "method"
VALID = "is_valid"
PROPERTIES = tuple(dict.fromkeys(p for p in BENCHMARK_PROPERTIES + STABILITY_PROPERTIES + DERIVED_PROPERTIES
                                 if p != VALID))
MISSING = frozenset({"", "nan", "NaN", "NAN", "None", "none", "null", "NULL", "NA", "N/A"})
TRUE, FALSE = frozenset({"true", "1", "1.0", "yes"}), frozenset({"false", "0", "0.0", "no"})


@dataclass
class PublishedRow:
    """One published measurement: its file line, experiment, the entity fields it gives, validity, the
    measured properties sbench has columns for, and the other columns as the file has them."""

    line: int
    experiment: str
    entity: dict[str, Any]
    is_valid: bool
    values: dict[str, float | None] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


def required_columns() -> list[str]:
    """The columns every published file must have (``model_max_length`` may stand for ``tokens_per_sample``)."""
    fields = [f.name for f in EXPERIMENTS[METHODS["full"]].fields if f.required]
    return [METHOD, *("tokens_per_sample" if f == "model_max_length" else f for f in fields), VALID]


def missing_columns(columns: Iterable[str]) -> list[str]:
    have = set(columns)
    return [c for c in required_columns() if c not in have and not (c == "tokens_per_sample"
                                                                     and "model_max_length" in have)]


def experiment_of(method: str) -> str:
    found = METHODS.get(method.strip().lower())
    if found is None:
        spellings = sorted({k for k in METHODS if not k.startswith("finetune_")})
        raise ValueError(f"method {method!r} names no experiment (one of {', '.join(spellings)}, or an experiment "
                         "id)")
    return found


def _number(text: str, column: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{column} {text!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{column} {text!r} is not a finite number")
    return value


def _typed(kind: str, text: str, column: str) -> Any:
    """*text* as a value of a field of *kind*, before the field's own check (FieldSpec.coerce)."""
    if kind == "int":
        value = _number(text, column)
        if not value.is_integer():
            raise ValueError(f"{column} {text!r} is not an integer")
        return int(value)
    if kind == "float":
        return _number(text, column)
    if kind == "bool":
        low = text.strip().lower()
        if low in TRUE or low in FALSE:
            return low in TRUE
        raise ValueError(f"{column} {text!r} is not True or False")
    if kind == "list":
        try:
            value = json.loads(text)
        except ValueError:
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                raise ValueError(f"{column} {text!r} is not a list") from None
        return value
    return text


@functools.lru_cache(maxsize=1 << 16)
def _cell(experiment: str, name: str, column: str, text: str) -> Any:
    spec = EXPERIMENTS[experiment].field(name)
    assert spec is not None
    try:
        return spec.coerce(_typed(spec.kind, text, column), column)
    except InputError as exc:
        raise ValueError(str(exc)) from None


def _entity_cell(experiment: str, name: str, column: str, text: str) -> Any:
    """A cell of an entity field as its value (``ValueError`` says why not). A file of a million rows repeats
    the same few cells: each is checked once (a list, which a caller could change, is made anew each time)."""
    value = _cell(experiment, name, column, text)
    return list(value) if isinstance(value, list) else value


def _extra(text: str) -> Any:
    """Another column's cell as JSON keeps it: a finite number as a number, else the text."""
    try:
        value = float(text)
    except ValueError:
        return text
    return value if math.isfinite(value) else text


def parse_row(line: int, row: Mapping[str, str | None]) -> PublishedRow:
    """One published row (column -> cell text); ``ValueError`` says why it does not parse."""
    cells = {k: (v or "").strip() for k, v in row.items() if k is not None}
    if not cells.get(METHOD) or cells[METHOD] in MISSING:
        raise ValueError("method is empty")
    exp: Experiment = EXPERIMENTS[experiment_of(cells[METHOD])]
    names = set(exp.field_names)
    entity: dict[str, Any] = {}
    values: dict[str, float | None] = {}
    extra: dict[str, Any] = {}
    for column, text in cells.items():
        if column in (METHOD, VALID):
            continue
        # tokens_per_sample is model_max_length, unless the file has that column too
        name = RENAMED[column] if column in RENAMED and RENAMED[column] not in cells else column
        if name in names:
            if text in MISSING:
                continue
            entity[name] = _entity_cell(exp.id, name, column, text)
        elif name in PROPERTIES:
            values[name] = None if text in MISSING else _number(text, column)
        elif text not in MISSING:
            extra[column] = _extra(text)
    for f in exp.fields:
        if f.required and f.name not in entity:
            shown = "tokens_per_sample" if f.name == "model_max_length" and "model_max_length" not in cells else f.name
            raise ValueError(f"{shown} is empty ({f.help})")
    valid = cells.get(VALID, "")
    if valid in MISSING:
        raise ValueError("is_valid is empty: a measurement says whether it is valid (a failed one has no row)")
    low = valid.lower()
    if low not in TRUE and low not in FALSE:
        raise ValueError(f"is_valid {valid!r} is not True or False")
    return PublishedRow(line, exp.id, entity, low in TRUE, values, extra)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) \
            and not isinstance(b, bool):
        return float(a) == float(b)
    return a == b


# The field that names the reference trainer's release: a point trained by another trainer (sbench's own) never
# ran it, and carries only the field's default, so it is not paired on it.
TRAINER_RELEASE = "fms_hf_tuning_version"
REFERENCE_TRAINER = "fms-hf-tuning"


def matches(given: Mapping[str, Any], entity: Mapping[str, Any]) -> bool:
    """Whether a point whose entity is *entity* is the point a published row with *given* fields measured:
    every given field has the same value there (a field the point lacks is None); the reference trainer's
    release (:data:`TRAINER_RELEASE`) only where the point ran that trainer."""
    skip = TRAINER_RELEASE if entity.get("trainer") not in (None, REFERENCE_TRAINER) else None
    return all(_same(v, entity.get(k)) for k, v in given.items() if k != skip)
