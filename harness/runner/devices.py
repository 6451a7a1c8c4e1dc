"""What a rank ran on, as its ``rank.<rank>.json`` records it (both trainers): its device, the process group's
backend, and how the Trainer wrapped the model (proof that DDP or FSDP ran, not just that it was asked for).
torch is imported inside each function, as the trainers import it only after their launch stage opened."""

from __future__ import annotations

import os
from typing import Any


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
