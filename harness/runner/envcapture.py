"""Environment capture: what ran where, for ``environment.<host>.json`` and ``rank.<rank>.json``.

Secrets never reach the job directory: ``HF_TOKEN`` and every variable whose name contains
``TOKEN``, ``KEY``, ``SECRET`` or ``PASSWORD`` is written as ``"<redacted>"``.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil

from .. import __version__

ENV_PREFIXES = ("NCCL_", "CUDA_", "SLURM_", "SLURMD_", "SBENCH_", "HF_", "OMP_", "GLOO_", "TORCH_", "ACCELERATE_")
SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD")
REDACTED = "<redacted>"
PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "submitit", "duckdb", "nvidia-ml-py")


def is_secret(name: str) -> bool:
    upper = name.upper()
    return upper == "HF_TOKEN" or any(w in upper for w in SECRET_WORDS)


def relevant_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables that shape a run (NCCL, CUDA, SLURM, ...), secrets redacted, sorted by name."""
    environ = os.environ if environ is None else environ
    return {k: (REDACTED if is_secret(k) else v) for k, v in sorted(environ.items()) if k.startswith(ENV_PREFIXES)}


def package_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def _git_dir(start: Path) -> Path | None:
    for d in (start, *start.parents):
        g = d / ".git"
        if g.is_dir():
            return g
        if g.is_file():  # a worktree or submodule: "gitdir: <path>"
            text = g.read_text(encoding="utf-8").strip()
            if text.startswith("gitdir:"):
                p = Path(text.split(":", 1)[1].strip())
                return p if p.is_absolute() else (d / p).resolve()
    return None


def git_commit(start: str | Path | None = None) -> str | None:
    """The commit the harness runs from (``git rev-parse HEAD``), read from ``.git`` directly.

    Reading the files needs no git binary on compute nodes; None when not in a repository.
    """
    try:
        gd = _git_dir(Path(start or Path(__file__).resolve().parent))
        if gd is None:
            return None
        head = (gd / "HEAD").read_text(encoding="utf-8").strip()
        if not head.startswith("ref:"):
            return head or None
        ref = head.split(":", 1)[1].strip()
        common = gd
        if (gd / "commondir").is_file():
            common = (gd / (gd / "commondir").read_text(encoding="utf-8").strip()).resolve()
        for base in (gd, common):
            f = base / ref
            if f.is_file():
                return f.read_text(encoding="utf-8").strip() or None
        packed = common / "packed-refs"
        if packed.is_file():
            for line in packed.read_text(encoding="utf-8").splitlines():
                parts = line.split()
                if len(parts) == 2 and parts[1] == ref:
                    return parts[0]
        return None  # a branch with no commits yet
    except OSError:
        return None


def gpus(max_devices: int | None = None) -> tuple[list[dict[str, Any]], str | None]:
    """The GPUs NVML sees after ``CUDA_VISIBLE_DEVICES`` (backend chosen as for the sampler)."""
    from .sampler import NvmlBackend, open_backend

    backend, note = open_backend(max_devices=max_devices)
    try:
        devs = backend.visible_devices() if isinstance(backend, NvmlBackend) else backend.devices()
        return [d.to_dict() for d in devs], note
    finally:
        backend.close()


def capture(host: str, machine_rank: int | None = None) -> dict[str, Any]:
    """The body of ``environment.<host>.json``."""
    gpu_list, note = gpus()
    return {
        "host": host,
        "machine_rank": machine_rank,
        "hostname": socket.gethostname(),
        "t_wall": time.time(),
        "python": {"version": platform.python_version(), "executable": sys.executable,
                   "implementation": platform.python_implementation()},
        "platform": platform.platform(),
        "packages": package_versions(),
        "sbench_version": __version__,
        "git_commit": git_commit(),
        "gpus": gpu_list,
        "gpu_note": note,
        "cuda_device_order": os.environ.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST"),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_total_mb": round(psutil.virtual_memory().total / 2**20, 1),
        "env": relevant_env(),
    }
