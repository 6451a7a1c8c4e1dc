"""What a rank ran on, as its ``rank.<rank>.json`` records it (both trainers): its device, the process group's
backend, how the Trainer wrapped the model (proof that DDP or FSDP ran, not just that it was asked for), and
the settings it ran with beside the ones the point asked for (:func:`what_ran`).
torch is imported inside each function, as the trainers import it only after their launch stage opened."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sysconfig
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.spec.catalog import dtype_name


def device_info(local_rank: int) -> Any:
    """``cpu``, or the CUDA device this rank trains on."""
    import torch  # heavy: only where a model is built or trained

    if not torch.cuda.is_available():
        return "cpu"
    idx = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(idx)
    uuid = getattr(props, "uuid", None)
    uuid_text = (f"GPU-{uuid}" if uuid is not None and not str(uuid).startswith("GPU-")
                 else (str(uuid) if uuid else None))
    return {"type": "cuda", "index": idx, "local_rank": local_rank, "name": props.name, "uuid": uuid_text,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}


def flash_attn_problem() -> str | None:
    """Why flash-attention cannot run in this python, or None when its package imports. A flash_attn built for
    another torch is found but fails to load, and the model would fail with it."""
    if importlib.util.find_spec("flash_attn") is None:
        return "the flash_attn package is not installed in the trainer's python"
    try:
        import flash_attn  # noqa: F401  # optional: imported only to learn whether it loads against this torch
    except Exception as exc:  # noqa: BLE001 - an ABI mismatch raises ImportError, OSError or a RuntimeError
        return f"the flash_attn package does not load ({type(exc).__name__}: {exc})"[:300]
    return None


def triton_build_problem() -> str | None:
    """Why Triton could not build a kernel here, or None when it can (or is not installed: nothing to build).
    The first time a Triton kernel runs, Triton compiles its launcher with a C compiler (``$CC``, else gcc, else
    clang) against this python's headers; a machine without either fails every kernel at its first call."""
    if importlib.util.find_spec("triton") is None:
        return None
    cc = (os.environ.get("CC") or "").split()
    if not (cc and shutil.which(cc[0])) and not shutil.which("gcc") and not shutil.which("clang"):
        return "no C compiler ($CC, gcc or clang) for Triton to build its kernels' launcher with"
    scheme = sysconfig.get_default_scheme() if hasattr(sysconfig, "get_default_scheme") else None
    include = sysconfig.get_paths(scheme=scheme).get("include") if scheme else sysconfig.get_paths().get("include")
    if not include or not (Path(include) / "Python.h").is_file():
        return f"no Python.h in {include} (the python headers) for Triton to build its kernels' launcher against"
    return None


def backend_name() -> str | None:
    """The process group's backend (with its device map where torch has one); None without a process group."""
    import torch  # heavy: only where a model is built or trained

    if not torch.distributed.is_initialized():
        return None
    try:
        return str(torch.distributed.get_backend_config())
    except Exception:  # noqa: BLE001 - older torch
        return str(torch.distributed.get_backend())


def wrapping(trainer: Any) -> dict[str, Any]:
    """How the model was actually wrapped: proof that DDP/FSDP ran, not just that it was asked for."""
    sharded: tuple[type, ...] = ()
    try:
        from torch.distributed.tensor import DTensor  # heavy: only where a model is built or trained

        sharded = (DTensor,)
    except ImportError:  # pragma: no cover
        pass
    wrapped = getattr(trainer, "model_wrapped", None) or trainer.model
    params = list(trainer.model.parameters())
    return {"wrapped_class": type(wrapped).__name__,
            "model_class": type(trainer.model).__name__,
            "sharded_parameters": sum(1 for p in params if isinstance(p, sharded)),
            "parameters_tensors": len(params)}


def loaded_dtype(model: Any) -> str | None:
    """The dtype the model's weights are in: the one most floating-point parameter elements have (a LoRA
    adapter in float32 beside bfloat16 weights does not change it); None for a model without any."""
    elements: dict[str, int] = {}
    for p in model.parameters():
        if p.is_floating_point():
            name = dtype_name(p.dtype)
            elements[name] = elements.get(name, 0) + int(getattr(p, "ds_numel", 0) or p.numel())  # ZeRO-3 partitions
    return max(elements, key=lambda k: elements[k]) if elements else None


def attention_of(model: Any) -> str | None:
    """The attention implementation the loaded model's config holds (``sdpa``, ``flash_attention_2``, ...)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    value = getattr(getattr(base, "config", None), "_attn_implementation", None)
    return str(value) if value else None


def _why(setting: str, asked: Any, cuda: bool) -> str:
    if not cuda:
        return "no CUDA device"  # the trainer loads float32 weights without mixed precision or flash-attention
    if setting == "attn_implementation" and asked == "flash_attention_2":
        problem = flash_attn_problem()
        if problem is not None:
            return problem
    return "the trainer chose it"


def what_ran(asked: Mapping[str, Any], model: Any, bf16: Any, fp16: Any, cuda: bool) -> tuple[dict[str, Any],
                                                                                            list[dict[str, Any]]]:
    """``(ran, adjustments)``: the settings this rank ran with, read off the loaded model and the Trainer's
    arguments (``torch_dtype``, ``bf16``, ``fp16``, ``attn_implementation``), and one ``{"setting", "asked",
    "used", "why"}`` for each that differs from what the point *asked* (the reference command line)."""
    ran = {"torch_dtype": loaded_dtype(model), "bf16": bool(bf16), "fp16": bool(fp16),
           "attn_implementation": attention_of(model)}
    adjustments = []
    for k, used in ran.items():
        want = asked.get(k)
        if want is None or used is None or (dtype_name(want) if k == "torch_dtype" else want) == used:
            continue
        adjustments.append({"setting": k, "asked": want, "used": used, "why": _why(k, want, cuda)})
    return ran, adjustments
