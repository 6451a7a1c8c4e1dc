"""A model's ``config.json``: read and checked where it is readable here (a local directory or the HF cache),
else the architecture facts sbench ships for a catalogue model (``model_configs.yaml``); and what it says
(a vision-language model, the number of experts). The memory prediction and the validity rules read it."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from harness.contract.errors import CatalogError, InputError

from .schema import show
from .yamlio import loads_yaml

MAX_CONFIG_BYTES = 16 << 20  # a model's config.json is a few KiB; a larger one is not a config
# The counts of a config.json that sbench reads (memory prediction, the MoE rules): (smallest, largest).
CONFIG_COUNTS: dict[str, tuple[int, int]] = {
    "hidden_size": (1, 1 << 20), "intermediate_size": (1, 1 << 22), "num_attention_heads": (1, 1 << 14),
    "num_key_value_heads": (1, 1 << 14), "head_dim": (1, 1 << 14), "num_hidden_layers": (1, 1 << 14),
    "vocab_size": (1, 1 << 27), "num_local_experts": (0, 1 << 16), "num_experts": (0, 1 << 16),
    "n_routed_experts": (0, 1 << 16)}
CONFIG_FLAGS = ("tie_word_embeddings", "attention_bias", "mlp_bias")


def check_model_config(doc: Any, source: str, prefix: str = "") -> dict[str, Any]:
    """*doc* (a parsed config.json) when every key sbench reads from it holds a value it can use; else an
    :class:`InputError` naming *source* and the key. A count is a whole number in :data:`CONFIG_COUNTS`'s
    range (a negative layer count or a hidden size of 1e308 is refused, never computed with)."""
    if not isinstance(doc, dict):
        kind = "a list" if isinstance(doc, list) else type(doc).__name__ if doc is not None else "null"
        raise InputError(f"{source}: {prefix.rstrip('.') or 'the document'} is {kind}, not a JSON object; a model's "
                         "config.json maps keys such as model_type and hidden_size to values")
    for key, (lo, hi) in CONFIG_COUNTS.items():
        value = doc.get(key)
        if value is None:
            continue
        ok = (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and math.isfinite(value) and value.is_integer())
        if not ok or not lo <= value <= hi:
            raise InputError(f"{source}: {prefix}{key} is {show(value)}; a model config needs a whole number from "
                             f"{lo} to {hi:,} here - fix the file or point model_map at the model's real config")
        doc[key] = int(value)
    for key in CONFIG_FLAGS:
        if doc.get(key) is not None and not isinstance(doc[key], bool):
            raise InputError(f"{source}: {prefix}{key} is {show(doc[key])}; expected true or false")
    if doc.get("model_type") is not None and not isinstance(doc["model_type"], str):
        raise InputError(f"{source}: {prefix}model_type is {show(doc['model_type'])}; expected a name such as "
                         "'llama'")
    quant = doc.get("quantization_config")
    if quant is not None:
        if not isinstance(quant, dict):
            raise InputError(f"{source}: {prefix}quantization_config is {show(quant)}; expected a JSON object")
        if quant.get("quant_method") is not None and not isinstance(quant["quant_method"], str):
            raise InputError(f"{source}: {prefix}quantization_config.quant_method is {show(quant['quant_method'])}; "
                             "expected a name such as 'gptq'")
    if doc.get("text_config") is not None:
        check_model_config(doc["text_config"], source, f"{prefix}text_config.")
    return doc


def read_model_config(path: str | Path) -> dict[str, Any]:
    """A config.json read and checked (:func:`check_model_config`): a regular file of at most
    :data:`MAX_CONFIG_BYTES`, one JSON object; every problem is an :class:`InputError` naming the file."""
    p = Path(path)
    try:
        if not p.is_file():
            raise InputError(f"{p}: is not a regular file; a model's config.json is one")
        with p.open("rb") as fh:
            data = fh.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:
            raise InputError(f"{p}: is larger than {MAX_CONFIG_BYTES} bytes; a model's config.json is a few KiB")
        doc = json.loads(data.decode("utf-8"))
    except OSError as exc:
        raise InputError(f"{p}: cannot be read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{p}: is not UTF-8 text ({exc.reason} at byte {exc.start}); a config.json is JSON") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{p}:{exc.lineno}: invalid JSON: {exc.msg} (column {exc.colno})") from None
    except RecursionError:
        raise InputError(f"{p}: invalid config.json: nested too deeply to be a model config") from None
    except ValueError as exc:  # a number too long to convert
        raise InputError(f"{p}: invalid JSON: {exc}") from None
    return check_model_config(doc, str(p))


def model_config(source: str) -> dict[str, Any] | None:
    """The model's config.json when it can be found locally (a directory, or the HF cache), checked
    (:func:`read_model_config`: a damaged one is an :class:`InputError` naming the file and key); else None."""
    cand = Path(source).expanduser()
    if cand.is_dir():
        cfg = cand / "config.json"
        return read_model_config(cfg) if cfg.exists() else None
    try:
        from huggingface_hub import try_to_load_from_cache  # heavy: only to find or fetch a model
    except ImportError:  # pragma: no cover - transformers depends on it
        return None
    try:
        hit = try_to_load_from_cache(source, "config.json")
    except Exception:  # noqa: BLE001 - an invalid repo id is simply "not found locally"
        return None
    if isinstance(hit, str) and os.path.exists(hit):
        return read_model_config(hit)
    return None


@lru_cache(maxsize=1)
def catalogue_configs() -> dict[str, dict[str, Any]]:
    """Catalogue model name -> its architecture facts (``model_configs.yaml``: config.json's own keys)."""
    text = resources.files("harness.spec").joinpath("model_configs.yaml").read_text(encoding="utf-8")
    doc = loads_yaml(text, "<built-in model configs>", CatalogError) or {}
    return {str(k): dict(v) for k, v in doc.items()}


CATALOGUE_CONFIG = "sbench's catalogue (harness/spec/model_configs.yaml)"


def architecture(model_name: str, source: str | None) -> tuple[dict[str, Any] | None, str | None]:
    """(config, where it comes from) of a model: its own config.json when readable here (a local directory
    or the HF cache), else the architecture facts sbench ships for a catalogue model name, else (None, None)."""
    cfg = model_config(source) if source else None
    if cfg is not None:
        return cfg, f"{source}/config.json"
    facts = catalogue_configs().get(model_name)
    return (dict(facts), CATALOGUE_CONFIG) if facts is not None else (None, None)


# config.json model_type values of vision-language architectures (image + text in, text out) that the
# trainers can load: transformers' AutoModelForImageTextToText (fms-hf-tuning: AutoModelForVision2Seq).
VISION_MODEL_TYPES = frozenset({
    "llava", "llava_next", "llava_onevision", "llava_next_video", "mllama", "qwen2_vl", "qwen2_5_vl", "idefics2",
    "idefics3", "paligemma", "smolvlm", "gemma3", "mistral3", "pixtral", "aya_vision", "granite_speech",
    "internvl", "chameleon", "blip-2", "instructblip", "fuyu", "kosmos-2", "llama4", "janus"})


def is_vision_config(config: Mapping[str, Any]) -> bool:
    """Whether a config.json is a vision-language model's: a known vision-language model_type, or a
    ``*ForConditionalGeneration`` architecture with a ``vision_config`` (LLaVA, LLaVA-NeXT and kin)."""
    if str(config.get("model_type") or "") in VISION_MODEL_TYPES:
        return True
    archs = config.get("architectures") or []
    return isinstance(config.get("vision_config"), Mapping) and (
        not archs or any(str(a).endswith("ForConditionalGeneration") for a in archs))


def num_local_experts(config: Mapping[str, Any]) -> int | None:
    for key in ("num_local_experts", "num_experts", "n_routed_experts"):
        value = config.get(key)
        if isinstance(value, int) and value > 0:
            return value
    text_cfg = config.get("text_config")
    if isinstance(text_cfg, Mapping):
        return num_local_experts(text_cfg)
    return None
