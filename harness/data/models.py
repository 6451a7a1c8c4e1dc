"""Model weights as jobs read them: a local directory that must be complete, or an HF id in the shared
model cache (``sbench model fetch`` puts it there, where the hub is reachable)."""

from __future__ import annotations

import os
from pathlib import Path

from harness.contract.errors import InputError, SbenchError
from harness.spec.modelmap import is_local_source, mount_visible

MODEL_WEIGHTS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf", "model.safetensors.index.json",
                 "pytorch_model.bin.index.json")


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json", "spiece.model")


# -- models --------------------------------------------------------------------------------------------------
def check_model_dir(path: Path) -> list[str]:
    """What a model directory lacks for training: [] when config, tokenizer and weights are there."""
    missing = []
    if not (path / "config.json").is_file():
        missing.append("config.json")
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        missing.append("a tokenizer (tokenizer.json or tokenizer.model + tokenizer_config.json)")
    if not any(any(path.glob(g)) for g in MODEL_WEIGHTS):
        missing.append("weights (*.safetensors or *.bin)")
    return missing


def model_cache(models_dir: str | None) -> str | None:
    """The shared HF hub cache jobs read (HF_HUB_CACHE): the inventory's models_dir, else the environment's."""
    return models_dir or os.environ.get("HF_HUB_CACHE") or None


def resolve_model(source: str, names: list[str], models_dir: str | None) -> tuple[str, Path | None]:
    """``(status, directory)``: ``ready`` with the local directory, or ``not_visible`` (a path not mounted here).

    Raises InputError, naming the fix, for a local directory that lacks files and for an HF id
    that is not in the shared model cache.
    """
    names_s = ", ".join(names)
    if is_local_source(source):
        path = Path(source).expanduser()
        if not path.exists():
            if not mount_visible(str(path)):
                return "not_visible", None
            raise InputError(f"model {names_s}: {path} does not exist; fix model_map: or create it (for a test model: "
                             f"sbench model tiny -o {path})")
        missing = check_model_dir(path)
        if missing:
            raise InputError(f"model {names_s}: {path} lacks {', '.join(missing)}; copy the full checkpoint there "
                             "or map the name to a complete directory in model_map:")
        return "ready", path
    cache = model_cache(models_dir)
    try:
        from huggingface_hub import snapshot_download  # heavy: only to find or fetch a model

        local = snapshot_download(source, cache_dir=cache, local_files_only=True)
    except Exception:  # noqa: BLE001 - LocalEntryNotFoundError, bad ids, ...
        where = cache or "the default HF cache"
        raise InputError(
            f"model {names_s}: {source} is not in the shared model cache ({where}); fetch it once where the hub "
            f"is reachable: sbench model fetch {source}{' --cache ' + cache if cache else ''} (or copy the "
            "checkpoint to a directory and map the name to it in model_map:)") from None
    path = Path(local)
    missing = check_model_dir(path)
    if missing:
        raise InputError(f"model {names_s}: the cached snapshot {path} of {source} lacks {', '.join(missing)}; "
                         f"fetch it again: sbench model fetch {source}")
    return "ready", path


def fetch_model(model_id: str, cache: str | None) -> Path:
    """Download config, tokenizer and weights of an HF id into ``cache`` (the shared model cache)."""
    if is_local_source(model_id):
        raise InputError(f"{model_id} is a path, not an HF id; a local directory needs no fetching")
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        raise InputError(f"cannot fetch {model_id}: HF_HUB_OFFLINE=1 here; run the fetch where the hub is "
                         "reachable (with the same --cache), or copy the checkpoint and map it in model_map:")
    from huggingface_hub import snapshot_download  # heavy: only to find or fetch a model

    try:
        local = snapshot_download(model_id, cache_dir=cache, allow_patterns=[
            "*.json", "*.safetensors", "*.model", "*.txt", "*.py", "tokenizer*", "*.tiktoken"])
    except Exception as exc:  # noqa: BLE001 - network errors, gated repos, unknown ids
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise SbenchError(f"cannot fetch {model_id} into {cache or 'the default HF cache'}: {first}. Without "
                          "hub access, copy the checkpoint to a directory every node can read and map the model "
                          "name to it in model_map:") from None
    missing = check_model_dir(Path(local))
    if missing:
        raise SbenchError(f"fetched {model_id} into {local}, but it lacks {', '.join(missing)}")
    return Path(local)
