"""Memory snapshots of one rank at fixed phases of a training step.

At steps 0 and 1, then every ``runner.memory_every_steps`` steps, a rank records the bytes of its
parameters, gradients and optimizer state, summed tensor by tensor (numel x element size; under
FSDP the local shard of each DTensor), so they are exact on any device; on CUDA also
``torch.cuda`` allocated, peak and reserved memory; everywhere the process's RSS. Under DeepSpeed
ZeRO the parameters, gradients and fp32 master weights are read from ZeRO's own partitions (the
master weights count as optimizer state, as in the ZeRO paper's accounting). Phases:
``before_forward`` (step begin), ``after_forward`` (a forward hook on the model, first micro-batch),
``after_backward`` (before the optimizer step) and ``after_optimizer`` (after it).
"""

from __future__ import annotations

import time
from typing import Any

import psutil

PHASES = ("before_forward", "after_forward", "after_backward", "after_optimizer")


def tensor_bytes(t: Any) -> int:
    local = t.to_local() if hasattr(t, "to_local") else t
    return int(local.numel()) * int(local.element_size())


def optimizer_of(opt: Any) -> Any:
    """The torch optimizer that holds the state: inside accelerate's AcceleratedOptimizer, and inside
    DeepSpeed's ZeRO optimizer too (whose torch optimizer steps the fp32 partitions)."""
    for _ in range(4):
        inner = getattr(opt, "optimizer", None)
        if inner is None:
            break
        opt = inner
    return opt


def zero_optimizer(opt: Any) -> Any:
    """DeepSpeed's ZeRO optimizer (stage 1/2 or 3) inside accelerate's wrapper, else None."""
    for _ in range(4):
        if opt is None or type(opt).__module__.startswith("deepspeed.runtime.zero"):
            return opt
        opt = getattr(opt, "optimizer", None)
    return None


class _Unique:
    """Bytes of the distinct storages behind some tensors: DeepSpeed's parameters, gradients and
    partitions are views into flat buffers, so a buffer counts once, whole (padding included)."""

    def __init__(self) -> None:
        self.seen: set[int] = set()

    def add(self, t: Any) -> int:
        import torch  # heavy: only where a model is built or trained

        if not torch.is_tensor(t) or t.numel() == 0:
            return 0
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key in self.seen:
            return 0
        self.seen.add(key)
        return int(storage.nbytes())


def _tensors(obj: Any) -> list[Any]:
    """The tensors in a DeepSpeed attribute: a tensor, or lists/dicts of them (None skipped)."""
    if obj is None:
        return []
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        return [t for x in obj for t in _tensors(x)]
    return [obj]


def _zero_parts(zero: Any, params: list[Any]) -> dict[str, int]:
    """Parameters, gradients and fp32 master weights of one rank under DeepSpeed ZeRO, from the
    tensors themselves: a ZeRO-3 parameter is its local partition (``ds_tensor``) plus whatever is
    gathered (persistent small parameters, or a layer inside its forward); gradients are the
    partitioned buffers ZeRO reduces into plus any ``.grad`` still on a parameter; the master weights
    are the fp32 partitions the inner optimizer steps (counted with the optimizer state)."""
    seen = _Unique()
    param_b = 0
    for p in params:
        if hasattr(p, "ds_tensor"):
            param_b += seen.add(p.ds_tensor)
        param_b += seen.add(p.data)
    grads = _Unique()
    grad_b = sum(grads.add(p.grad) for p in params if p.grad is not None)
    for name in ("averaged_gradients", "grad_partitions_flat_buffer"):
        grad_b += sum(grads.add(t) for t in _tensors(getattr(zero, name, None)))
    masters = _tensors(getattr(zero, "single_partition_of_fp32_groups", None)) + \
        _tensors(getattr(zero, "fp32_partitioned_groups_flat", None))
    grad_b += sum(grads.add(m.grad) for m in masters if m.grad is not None)
    master = _Unique()
    return {"params": param_b, "grads": grad_b, "master": sum(master.add(m) for m in masters)}


def snapshot(model: Any, optimizer: Any, device: Any, step: int, phase: str) -> dict[str, Any]:
    import torch  # heavy: only where a model is built or trained

    params = list(model.parameters())
    zero = zero_optimizer(optimizer)
    snap: dict[str, Any] = {"step": step, "phase": phase, "t_wall": time.time()}
    master = 0
    if zero is not None:
        parts = _zero_parts(zero, params)
        snap.update(params_bytes=parts["params"], grads_bytes=parts["grads"],
                    trainable_bytes=sum(tensor_bytes(getattr(p, "ds_tensor", p)) for p in params if p.requires_grad))
        master = parts["master"]
    else:
        snap.update(params_bytes=sum(tensor_bytes(p) for p in params),
                    trainable_bytes=sum(tensor_bytes(p) for p in params if p.requires_grad),
                    grads_bytes=sum(tensor_bytes(p.grad) for p in params if p.grad is not None))
    snap["optimizer_bytes"] = None
    opt = optimizer_of(optimizer) if optimizer is not None else None
    if opt is not None:
        snap["optimizer_bytes"] = master + sum(
            tensor_bytes(v) for st in opt.state.values() for v in st.values()
            if torch.is_tensor(v) and v.dim() > 0)  # not the scalar step counters
    if getattr(device, "type", None) == "cuda" and torch.cuda.is_available():
        snap.update(cuda_allocated_bytes=int(torch.cuda.memory_allocated(device)),
                    cuda_peak_bytes=int(torch.cuda.max_memory_allocated(device)),
                    cuda_reserved_bytes=int(torch.cuda.memory_reserved(device)))
    try:
        snap["rss_bytes"] = int(psutil.Process().memory_info().rss)
    except Exception:  # noqa: BLE001 - RSS is a bonus
        snap["rss_bytes"] = None
    return snap


class MemoryRecorder:
    """Decides which steps are recorded and keeps the snapshots (see the module docstring)."""

    def __init__(self, every: int, device: Any) -> None:
        self.every = max(1, int(every))
        self.device = device
        self.snaps: list[dict[str, Any]] = []
        self.optimizer: Any = None
        self._forward_step: int | None = None
        self._hooked = False
        self.engine_of: Any = None  # () -> the DeepSpeed engine, when the run has one (set by the trainer)
        self.deepspeed = False

    def attach_deepspeed(self, model: Any, step_of: Any) -> bool:
        """Under DeepSpeed, accelerate's backward() also runs the engine's optimizer step, so the
        Trainer's optimizer callbacks fire after it: take after_backward and after_optimizer around
        the engine's own step instead (at accumulation boundaries, where it steps)."""
        engine = self.engine_of() if self.engine_of is not None else None
        if self.deepspeed or engine is None or model is None:
            return self.deepspeed
        self.deepspeed = True
        step = engine.step

        def measured_step(*a: Any, **kw: Any) -> Any:
            boundary = bool(engine.is_gradient_accumulation_boundary())
            if boundary:
                self.take(model, step_of(), "after_backward")
            out = step(*a, **kw)
            if boundary:
                self.take(model, step_of(), "after_optimizer")
            return out

        engine.step = measured_step
        return True

    def wanted(self, step: int) -> bool:
        return step <= 1 or step % self.every == 0

    def take(self, model: Any, step: int, phase: str) -> None:
        if model is not None and self.wanted(step):
            self.snaps.append(snapshot(model, self.optimizer, self.device, step, phase))

    def hook(self, model: Any, step_of: Any) -> None:
        """After-forward snapshots, from a forward hook on the top module (once per recorded step)."""
        if self._hooked or model is None:
            return
        self._hooked = True

        def after_forward(module: Any, args: Any, output: Any) -> None:
            step = step_of()
            if module.training and self.wanted(step) and self._forward_step != step:
                self._forward_step = step
                self.snaps.append(snapshot(module, self.optimizer, self.device, step, "after_forward"))

        model.register_forward_hook(after_forward)
