"""Memory snapshots of one rank at fixed phases of a training step.

At steps 0 and 1, then every ``runner.memory_every_steps`` steps, a rank records the bytes of its
parameters, gradients and optimizer state, summed tensor by tensor (numel x element size; under
FSDP the local shard of each DTensor), so they are exact on any device; on CUDA also
``torch.cuda`` allocated, peak and reserved memory; everywhere the process's RSS. Phases:
``before_forward`` (step begin), ``after_forward`` (a forward hook on the model, first micro-batch),
``after_backward`` (before the optimizer step) and ``after_optimizer`` (after it).
"""

from __future__ import annotations

import time
from typing import Any

PHASES = ("before_forward", "after_forward", "after_backward", "after_optimizer")


def tensor_bytes(t: Any) -> int:
    local = t.to_local() if hasattr(t, "to_local") else t
    return int(local.numel()) * int(local.element_size())


def optimizer_of(opt: Any) -> Any:
    return getattr(opt, "optimizer", opt)  # accelerate's AcceleratedOptimizer wraps the torch one


def snapshot(model: Any, optimizer: Any, device: Any, step: int, phase: str) -> dict[str, Any]:
    import torch

    params = list(model.parameters())
    snap: dict[str, Any] = {
        "step": step, "phase": phase, "t_wall": time.time(),
        "params_bytes": sum(tensor_bytes(p) for p in params),
        "trainable_bytes": sum(tensor_bytes(p) for p in params if p.requires_grad),
        "grads_bytes": sum(tensor_bytes(p.grad) for p in params if p.grad is not None),
        "optimizer_bytes": None,
    }
    opt = optimizer_of(optimizer) if optimizer is not None else None
    if opt is not None:
        snap["optimizer_bytes"] = sum(tensor_bytes(v) for st in opt.state.values() for v in st.values()
                                      if torch.is_tensor(v) and v.dim() > 0)  # not the scalar step counters
    if getattr(device, "type", None) == "cuda" and torch.cuda.is_available():
        snap.update(cuda_allocated_bytes=int(torch.cuda.memory_allocated(device)),
                    cuda_peak_bytes=int(torch.cuda.max_memory_allocated(device)),
                    cuda_reserved_bytes=int(torch.cuda.memory_reserved(device)))
    try:
        import psutil

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
