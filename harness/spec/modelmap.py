"""The model map: model names -> where their weights are (an HF id or a local path, per variant), and per-model
LoRA ``target_modules``. ``models.yaml`` is the built-in map; a sweep's ``model_map:`` and ``$SBENCH_MODEL_MAP``
go on top."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from harness.contract import envvars
from harness.contract.errors import CatalogError, InputError

from .schema import text_problem
from .yamlio import load_yaml, loads_yaml

VARIANTS = ("Vanilla", "GPTQ-Quantized")
MODEL_ENTRY_KEYS = VARIANTS + ("target_modules", "path", "id")


@dataclass
class ModelMap:
    """Model name -> weights source per variant, plus optional per-model LoRA target modules."""

    entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    origins: dict[str, str] = field(default_factory=dict)

    def names(self) -> list[str]:
        return sorted(self.entries)

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def source(self, name: str, variant: str = "Vanilla") -> str | None:
        entry = self.entries.get(name)
        if not entry:
            return None
        return entry.get(variant) or (entry.get("Vanilla") if variant == "Vanilla" else None)

    def target_modules(self, name: str) -> tuple[str, ...] | None:
        entry = self.entries.get(name) or {}
        tm = entry.get("target_modules")
        return tuple(tm) if tm else None

    def merged(self, doc: Any, source: str, base_dir: Path | None) -> ModelMap:
        """A copy with *doc* (name -> id/path, or name -> {Vanilla:, GPTQ-Quantized:, target_modules:}) on top."""
        out = ModelMap({k: dict(v) for k, v in self.entries.items()}, dict(self.origins))
        if doc is None:
            return out
        if not isinstance(doc, Mapping):
            raise InputError(f"{source}: model_map must be a mapping of model name -> HF id or local path")
        for name, value in doc.items():
            name = str(name)
            _check_text(source, f"model_map.{name}", name, 256)
            for k, v in (value.items() if isinstance(value, Mapping) else [("", value)]):
                for item in (v if isinstance(v, list) else [v]):
                    if isinstance(item, str):
                        _check_text(source, f"model_map.{name}" + (f".{k}" if k else ""), item, 1024)
            if isinstance(value, (str, Path)):
                entry: dict[str, Any] = {"Vanilla": _resolve_source(str(value), base_dir)}
            elif isinstance(value, Mapping):
                unknown = [k for k in value if k not in MODEL_ENTRY_KEYS]
                if unknown:
                    raise InputError(
                        f"{source}: model_map.{name}.{unknown[0]} is not a known key; valid keys: "
                        f"{', '.join(MODEL_ENTRY_KEYS)}")
                entry = {}
                for k, v in value.items():
                    if k in ("path", "id"):
                        k = "Vanilla"
                    if k == "target_modules":
                        if isinstance(v, str):
                            v = v.split()
                        if not isinstance(v, list) or not v:
                            raise InputError(f"{source}: model_map.{name}.target_modules must be a non-empty list")
                        entry[k] = [str(x) for x in v]
                    elif not isinstance(v, str) or not v.strip():
                        raise InputError(f"{source}: model_map.{name}.{k} must be a HF id or a path, got {v!r}")
                    else:
                        entry[k] = _resolve_source(v, base_dir)
            else:
                raise InputError(f"{source}: model_map.{name} must be a HF id, a path, or a mapping; got {value!r}")
            merged_entry = dict(out.entries.get(name, {}))
            merged_entry.update(entry)
            out.entries[name] = merged_entry
            out.origins[name] = source
        return out


def _check_text(source: str, key: str, text: str, max_len: int) -> None:
    problem = text_problem(text, max_len)
    if problem:
        raise InputError(f"{source}: {key} {problem}")


def is_local_source(src: str) -> bool:
    return src.startswith(("/", "./", "../", "~")) or os.path.isdir(src)


def _resolve_source(src: str, base_dir: Path | None) -> str:
    src = src.strip()
    if src.startswith("~"):
        return str(Path(src).expanduser())
    if src.startswith(("./", "../")) and base_dir is not None:
        return str((base_dir / src).resolve())
    return src


def builtin_model_map() -> ModelMap:
    text = resources.files("harness.spec").joinpath("models.yaml").read_text(encoding="utf-8")
    doc = loads_yaml(text, "<built-in model map>", CatalogError)
    mm = ModelMap().merged(doc, "<built-in model map>", None)
    for name in mm.entries:
        mm.origins[name] = "built-in"
    return mm


def load_model_map(path: str | Path | None = None) -> ModelMap:
    """Built-in map, then ``$SBENCH_MODEL_MAP`` or *path* on top."""
    mm = builtin_model_map()
    p = path or envvars.MODEL_MAP.get()
    if p:
        p = Path(p)
        mm = mm.merged(load_yaml(p, InputError, "model map"), str(p), p.parent.resolve())
    return mm


def mount_visible(src: str) -> bool:
    """Whether this machine sees the file system *src* lives on: its top-level directory exists (a
    missing model under a visible /shared is a typo; a missing /models may be mounted on compute nodes)."""
    p = Path(src).expanduser()
    parts = p.parts
    return len(parts) < 2 or Path(parts[0], parts[1]).exists()
