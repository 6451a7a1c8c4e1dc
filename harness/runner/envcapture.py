"""Environment capture: what ran where, for ``environment.<host>.json`` and ``rank.<rank>.json``.

Only variables that shape a run are recorded, by allow-list (:data:`ENV_PREFIXES` and
:data:`ENV_NAMES`): NCCL, CUDA, SLURM, the launcher's rendezvous, thread counts, the Hugging Face
cache and offline switches, and sbench's own. Anything else (``HF_AUTH``, ``AWS_*``, a site's
``*_API_PASS``) is never written. Among the recorded ones, a variable whose name says credential
(:data:`SECRET_WORDS`) or whose value looks like one (:func:`looks_like_secret`) is written as
``"<redacted>"``; a URL's password alone is replaced (:func:`redact_value`), so the scheme and host stay.
"""

from __future__ import annotations

import base64
import binascii
import importlib.metadata
import importlib.util
import ipaddress
import os
import platform
import re
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil

from harness import __version__
from harness.contract import envvars

from .sampler import NvmlBackend, open_backend

ENV_PREFIXES = ("NCCL_", "CUDA_", "SLURM_", "SLURMD_", "OMP_", "GLOO_", "TORCH_", "TORCHELASTIC_", "PYTORCH_",
                "ACCELERATE_", "NVIDIA_", "UCX_", "FI_", "MKL_", "KMP_")
ENV_NAMES = frozenset({
    "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
    "ROLE_RANK", "NODE_RANK", "TOKENIZERS_PARALLELISM", "PYTHONUNBUFFERED", "LD_LIBRARY_PATH",
    "HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE",
    "HF_HUB_ENABLE_HF_TRANSFER", "TRANSFORMERS_OFFLINE", "TRANSFORMERS_CACHE",
}) | envvars.RECORDED
SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASS", "PWD", "AUTH", "CRED", "COOKIE", "SESSION", "PRIVATE",
                "SIGNATURE")
REDACTED = "<redacted>"
PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "submitit", "duckdb", "nvidia-ml-py",
            "flash-attn", "flash_attn", "deepspeed", "bitsandbytes", "nvidia-nccl-cu12", "nvidia-nccl-cu13",
            "nvidia-cudnn-cu12", "nvidia-cudnn-cu13", "nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime-cu13")
SYSFS_IB = Path(envvars.SYSFS_IB.get())
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
_SECRET_VALUES = re.compile(
    r"hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_\w{20,}|sk-[A-Za-z0-9_-]{20,}|AKIA[0-9A-Z]{16}"
    r"|xox[abposr]-[A-Za-z0-9-]{10,}|eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}|-----BEGIN [A-Z ]*PRIVATE KEY"
    r"|\b[Bb]earer\s+\S{8,}")
_OPAQUE = re.compile(r"[A-Za-z0-9_+=]{32,}")
# A base64 run (standard alphabet, with its '=' padding): an AWS secret access key, a base64-encoded key.
_B64_RUN = re.compile(r"[A-Za-z0-9+/]{20,}={0,2}")
# Three base64url parts joined by dots (the signature may be empty): a JWT when the first decodes to a JSON object.
_JWT = re.compile(r"(?<![A-Za-z0-9_.-])([A-Za-z0-9_-]{4,})\.([A-Za-z0-9_-]{4,})\.([A-Za-z0-9_-]*)(?![A-Za-z0-9_.-])")
# scheme://user:password@host: the password is what goes (a port is digits followed by '/' or the end).
_URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*):(?!\d+(?:[/?#]|$))(?P<pw>[^\s@]+)@")
MIN_CLASS_CHANGES = 0.25  # of a base64 run's letters and digits: random text changes class ~0.6 of the time
PATH_CLASS_CHANGES = 0.45  # ... of one that starts with '/' (a path)
LETTERS_CLASS_CHANGES = 0.4  # ... of one without digits (CamelCase words change class ~0.3 of the time)


def _changes(run: str) -> float:
    """How often a letter or digit of *run* differs in class (upper, lower, digit) from the one before it,
    within each '/'- or '+'-separated part: ~0.6 for random base64, far less for words and paths."""
    parts = [p for p in re.split(r"[+/=]", run) if p]
    chars = sum(len(p) for p in parts)
    if chars == 0:
        return 0.0

    def cls(c: str) -> int:
        return 0 if c.isupper() else 1 if c.islower() else 2

    changes = sum(cls(a) != cls(b) for p in parts for a, b in zip(p, p[1:]))
    return changes / chars


def _opaque_base64(value: str) -> bool:
    """A run of 20+ base64 characters holding '/', '+' or '=' padding, with upper case, lower case (and
    digits) mixed as random text mixes them: an AWS secret key, a base64-encoded key. A path, a word list or
    a version string is not."""
    for m in _B64_RUN.finditer(value):
        run = m.group(0)
        if not any(c in run for c in "+/=") or not (re.search(r"[A-Z]", run) and re.search(r"[a-z]", run)):
            continue
        # An absolute path (/data/Llama3/Meta8B) or CamelCase words mix classes too, less than random text.
        need = (PATH_CLASS_CHANGES if run.startswith("/") else
                MIN_CLASS_CHANGES if re.search(r"[0-9]", run) else LETTERS_CLASS_CHANGES)
        if _changes(run) >= need:
            return True
    return False


def _jwt(value: str) -> bool:
    """Three base64url parts joined by dots whose first part decodes to a JSON object (a JWT's header);
    host names and dotted versions do not decode to one."""
    for m in _JWT.finditer(value):
        head = m.group(1)
        try:
            raw = base64.urlsafe_b64decode(head + "=" * (-len(head) % 4))
        except (ValueError, binascii.Error):
            continue
        if raw.lstrip()[:1] == b"{":
            return True
    return False


def is_secret(name: str) -> bool:
    """A variable whose name says it holds a credential."""
    upper = name.upper()
    return any(w in upper for w in SECRET_WORDS)


def looks_like_secret(value: str) -> bool:
    """A value shaped like a credential: a known token format, a URL with a password, a bearer token, a
    JWT, a base64 run with '/', '+' or '=' mixed like random text (an AWS secret key), or a long opaque mix
    of upper case, lower case and digits (UUIDs, paths, host names and node lists are not)."""
    if _SECRET_VALUES.search(value) or _URL_PASSWORD.search(value) or _jwt(value) or _opaque_base64(value):
        return True
    for m in _OPAQUE.finditer(value):
        tok = m.group(0)
        if re.search(r"[A-Z]", tok) and re.search(r"[a-z]", tok) and re.search(r"[0-9]", tok):
            return True
    return False


def redact_value(value: str) -> str:
    """*value* as it may be written down: a URL's password replaced by ``<redacted>`` (scheme, user and host
    kept), and the whole value ``<redacted>`` when anything else in it looks like a credential."""
    kept = _URL_PASSWORD.sub(lambda m: f"{m.group('head')}:{REDACTED}@", value)
    return REDACTED if looks_like_secret(kept.replace(REDACTED, "")) else kept


def is_recorded(name: str) -> bool:
    return name in ENV_NAMES or name.startswith(ENV_PREFIXES)


def relevant_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The allow-listed variables that shape a run, credentials redacted, sorted by name."""
    environ = os.environ if environ is None else environ
    return {k: (REDACTED if is_secret(k) else redact_value(v)) for k, v in sorted(environ.items()) if is_recorded(k)}


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
    backend, note = open_backend(max_devices=max_devices)
    try:
        devs = backend.visible_devices() if isinstance(backend, NvmlBackend) else backend.devices()
        return [d.to_dict() for d in devs], note
    finally:
        backend.close()


def _first(pk: dict[str, str | None], *names: str) -> str | None:
    return next((pk[n] for n in names if pk.get(n)), None)


def torch_cuda_runtime() -> str | None:
    """The CUDA runtime torch was built with, read from torch/version.py (no torch import: the node
    runner stays light)."""
    try:
        spec = importlib.util.find_spec("torch")
        if spec is None or not spec.submodule_search_locations:
            return None
        text = (Path(list(spec.submodule_search_locations)[0]) / "version.py").read_text(encoding="utf-8")
    except (OSError, ImportError, ValueError):
        return None
    m = re.search(r"^cuda(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", text, re.M)
    return m.group(1) if m else None


def nvml_versions() -> dict[str, str | None]:
    """The GPU driver and the CUDA version it supports, through NVML; empty without NVML."""
    try:
        import pynvml  # optional: NVML is there only with an NVIDIA driver

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no NVML library or no GPU
        return {}
    try:
        drv = pynvml.nvmlSystemGetDriverVersion()
        cuda = pynvml.nvmlSystemGetCudaDriverVersion_v2()
        return {"driver": drv.decode() if isinstance(drv, bytes) else str(drv),
                "cuda_driver": f"{cuda // 1000}.{cuda % 1000 // 10}"}
    except Exception:  # noqa: BLE001
        return {}
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip() or None
    except OSError:  # an unused GID's type reads as EINVAL
        return None


def ipv4_of_gid(gid: str) -> str | None:
    """The IPv4 address of an IPv4-mapped GID (``::ffff:a.b.c.d``), else None."""
    try:
        addr = ipaddress.IPv6Address(gid)
    except ValueError:
        return None
    return str(addr.ipv4_mapped) if addr.ipv4_mapped else None


def read_hcas(root: Path | None = None, ports: bool = True) -> list[dict[str, Any]]:
    """Every RDMA device under sysfs with its firmware, board id and type; with *ports*, each port's
    state, link layer, rate and the populated entries of its GID table (type, netdev, IPv4)."""
    root = SYSFS_IB if root is None else root
    try:
        devs = sorted(p for p in root.iterdir() if p.is_dir())
    except OSError:
        return []
    out = []
    for dev in devs:
        doc: dict[str, Any] = {"name": dev.name, "fw_ver": _read(dev / "fw_ver"), "board_id": _read(dev / "board_id"),
                               "hca_type": _read(dev / "hca_type")}
        if ports:
            doc["ports"] = []
            for port in sorted((dev / "ports").glob("*"), key=lambda p: int(p.name) if p.name.isdigit() else 0):
                gids = []
                for g in sorted((port / "gids").glob("*"), key=lambda p: int(p.name) if p.name.isdigit() else 0):
                    value = _read(g)
                    if not value or value == ZERO_GID:
                        continue
                    gids.append({"index": int(g.name), "gid": value,
                                 "type": _read(port / "gid_attrs" / "types" / g.name),
                                 "ndev": _read(port / "gid_attrs" / "ndevs" / g.name), "ipv4": ipv4_of_gid(value)})
                doc["ports"].append({"port": int(port.name) if port.name.isdigit() else port.name,
                                     "state": _read(port / "state"), "phys_state": _read(port / "phys_state"),
                                     "link_layer": _read(port / "link_layer"), "rate": _read(port / "rate"),
                                     "gids": gids})
        out.append(doc)
    return out


def hca_firmware(root: Path | None = None) -> list[dict[str, Any]]:
    """Each RDMA device's firmware, board id and type (no port scan: the node runner's start stays quick)."""
    return read_hcas(root, ports=False)


def provenance(packages: dict[str, str | None]) -> dict[str, Any]:
    """Driver, CUDA (driver and runtime), NCCL, cuDNN and flash-attn versions and HCA firmware, each
    None when not present on the node."""
    return {**{"driver": None, "cuda_driver": None}, **nvml_versions(),
            "cuda_runtime": torch_cuda_runtime(),
            "nccl": _first(packages, "nvidia-nccl-cu12", "nvidia-nccl-cu13"),
            "cudnn": _first(packages, "nvidia-cudnn-cu12", "nvidia-cudnn-cu13"),
            "flash_attn": _first(packages, "flash-attn", "flash_attn"),
            "hcas": hca_firmware()}


_DIGEST = re.compile(r"@(sha256:[0-9a-f]{64})")
_CONTAINERENV = Path("/run/.containerenv")  # podman writes it into every container it runs
_DOCKERENV = Path("/.dockerenv")


def container(asked: str | None = None, environ: Mapping[str, str] | None = None,
              containerenv: Path = _CONTAINERENV, dockerenv: Path = _DOCKERENV) -> dict[str, str | None]:
    """The container this process runs in: its runtime, image and digest (None where unknown).

    Apptainer (or Singularity) says its image in ``APPTAINER_CONTAINER`` (``SINGULARITY_CONTAINER``); podman
    writes ``/run/.containerenv`` (``image=``, ``imageid=``); docker leaves ``/.dockerenv`` and no name. With
    pyxis/enroot the job asked for its image (*asked*: the sbatch option ``container-image``, from
    ``slurm.extra``), which is recorded as asked. The digest is the image reference's ``@sha256:...`` or podman's
    image id; an image file is not read to compute one (it can be gigabytes, read at every start)."""
    env = os.environ if environ is None else environ
    runtime = image = digest = None
    if env.get("APPTAINER_CONTAINER") or env.get("SINGULARITY_CONTAINER"):
        runtime = "apptainer" if env.get("APPTAINER_CONTAINER") else "singularity"
        image = env.get("APPTAINER_CONTAINER") or env.get("SINGULARITY_CONTAINER")
    elif asked:
        runtime, image = "pyxis", str(asked)
    elif containerenv.is_file():
        runtime = "podman"
        fields = dict(re.findall(r'^(\w+)="?(.*?)"?$', _read(containerenv) or "", re.M))
        image, digest = fields.get("image") or None, fields.get("imageid") or None
    elif dockerenv.exists():
        runtime = "docker"
    if image and digest is None:
        m = _DIGEST.search(image)
        digest = m.group(1) if m else None
    return {"runtime": runtime, "image": image, "digest": digest}


def capture(host: str, machine_rank: int | None = None, container_image: str | None = None) -> dict[str, Any]:
    """The body of ``environment.<host>.json``; *container_image*: the image the job asked pyxis for."""
    gpu_list, note = gpus()
    return {
        "host": host,
        "machine_rank": machine_rank,
        "hostname": socket.gethostname(),
        "t_wall": time.time(),
        "python": {"version": platform.python_version(), "executable": sys.executable,
                   "implementation": platform.python_implementation()},
        "platform": platform.platform(),
        "packages": (pk := package_versions()),
        "provenance": provenance(pk),
        "sbench_version": __version__,
        "git_commit": git_commit(),
        "gpus": gpu_list,
        "gpu_note": note,
        "cuda_device_order": os.environ.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST"),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_total_mb": round(psutil.virtual_memory().total / 2**20, 1),
        "env": relevant_env(),
        "container": container(container_image),
    }
