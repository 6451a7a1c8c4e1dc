"""Trainer environments: one virtual environment per fms-hf-tuning release, built once, shared by the nodes.

fms-hf-tuning pins its own torch, transformers, trl and peft (3.2.2: torch 2.8, transformers 4.55,
trl 0.19, peft 0.19), so it cannot share sbench's environment. ``sbench env build fms-hf-tuning==X``
(and ``sbench prepare``) builds ``<envs_dir>/fms-hf-tuning-X``:

- a venv of the interpreter sbench runs on, with ``fms-hf-tuning==X`` installed by pip and nothing
  else chosen by sbench: what that release pins is what the environment holds;
- with ``--extras fms-accel``, the ``fms-accel`` extra and the acceleration plugins the experiments use
  (``fms-acceleration-peft`` for GPTQ-LoRA, ``-foak`` for fused kernels and ``fast_kernels``, ``-moe``
  for ``fast_moe``), added to the same environment;
- checked by importing ``tuning.sft_trainer`` (and each plugin) in it, so an environment whose
  packages resolve but do not import is a failed build, not a failed job;
- described by ``sbench-env.json`` (release, extras, plugins, every package's version, torch's CUDA
  build), which ``plan`` reads to say what can run.

A build goes into a temporary directory and is renamed into place, under a lock, so concurrent
builds and a killed build never leave a half environment where jobs look. A failed build leaves
``<name>.failed.json`` with pip's reason: ``plan`` marks the points invalid with it, until a build
succeeds.

``envs_dir``: the inventory's ``defaults.envs_dir`` (it must be visible from the compute nodes), else
``$SBENCH_ENVS_DIR``, else ``~/.cache/sbench/envs``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import InputError, SbenchError

PACKAGE = "fms-hf-tuning"
MANIFEST = "sbench-env.json"
EXTRAS = ("fms-accel",)
# What each acceleration feature needs in the environment (distribution name -> import name).
PLUGINS = {"fms-acceleration-peft": "fms_acceleration_peft", "fms-acceleration-foak": "fms_acceleration_foak",
           "fms-acceleration-moe": "fms_acceleration_moe"}
FEATURE_PLUGINS = {"gptq-lora": ("fms-acceleration-peft", "fms-acceleration-foak"),
                   "fast_kernels": ("fms-acceleration-foak",), "fast_moe": ("fms-acceleration-moe",)}
FAST_MOE_SINCE = (2, 4, 0)  # the reference: --fast_moe is only supported from fms-hf-tuning 2.4.0
# Runtime conflicts pip cannot see, found by the import check: the plugins pin numpy<2, and pyarrow
# declares no numpy requirement although pyarrow >= 22 refuses numpy 1.x at import.
ACCEL_CONSTRAINTS = ("pyarrow<22",)


class EnvBuildError(SbenchError):
    """pip or the import check failed; the message holds the reason (exit 1)."""


def release(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split("."))


def envs_root(inv: Any = None) -> Path:
    """Where environments live (see the module doc)."""
    from .plan import shared_dir

    configured = shared_dir(getattr(inv, "envs_dir", None), inv) if inv is not None else None
    if configured is not None:
        return configured
    env = os.environ.get("SBENCH_ENVS_DIR")
    if env:
        return Path(env).expanduser().resolve()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sbench" / "envs"


def env_name(version: str) -> str:
    return f"{PACKAGE}-{version}"


def parse_spec(text: str) -> str:
    """``fms-hf-tuning==3.2.2`` -> ``3.2.2``; anything else is an input error naming the form."""
    from .catalog import fms_version

    name, sep, version = str(text).partition("==")
    if name.strip() != PACKAGE or not sep:
        raise InputError(f"env build: expected {PACKAGE}==VERSION (e.g. {PACKAGE}==3.2.2), got {text!r}")
    try:
        return fms_version(version.strip())
    except ValueError as exc:
        raise InputError(f"env build: {exc}") from None


@dataclass
class TrainerEnv:
    """What ``plan``, ``render`` and ``prepare`` need to know of one release's environment."""

    version: str
    root: Path
    manifest: dict[str, Any] | None
    failure: dict[str, Any] | None

    @property
    def path(self) -> Path:
        return self.root / env_name(self.version)

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    @property
    def built(self) -> bool:
        return self.manifest is not None

    def plugins(self) -> dict[str, str]:
        return dict((self.manifest or {}).get("plugins") or {})

    def missing_plugins(self, feature: str) -> list[str]:
        have = self.plugins()
        return [p for p in FEATURE_PLUGINS[feature] if p not in have]

    def failed_reason(self, extras: tuple[str, ...] = ()) -> str | None:
        """The recorded failure, when it concerns a build this point needs."""
        f = self.failure
        if not f:
            return None
        if f.get("extras") and not extras and self.built:
            return None  # the plain environment is fine; only adding the plugins failed
        return str(f.get("reason") or "unknown reason")


def env_has(env: TrainerEnv, package: str) -> bool:
    """Whether a built environment holds *package* (its distribution name, any case)."""
    return package.lower() in {k.lower() for k in ((env.manifest or {}).get("packages") or {})}


def lookup(version: str, root: Path) -> TrainerEnv:
    path = root / env_name(version)
    manifest = failure = None
    with contextlib.suppress(OSError, ValueError):
        manifest = json.loads((path / MANIFEST).read_text())
    with contextlib.suppress(OSError, ValueError):
        failure = json.loads((root / f"{env_name(version)}.failed.json").read_text())
    return TrainerEnv(version, root, manifest if isinstance(manifest, dict) else None,
                      failure if isinstance(failure, dict) else None)


def list_envs(root: Path) -> list[TrainerEnv]:
    if not root.is_dir():
        return []
    versions = set()
    for p in root.iterdir():
        name = p.name.removesuffix(".failed.json")
        if name.startswith(PACKAGE + "-") and not name.startswith("."):
            versions.add(name[len(PACKAGE) + 1:])
    return [lookup(v, root) for v in sorted(versions, key=lambda v: (release(v) if v.replace(".", "").isdigit()
                                                                       else (0,)))]


@contextlib.contextmanager
def _lock(root: Path, name: str) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{name}.lock", "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _run(argv: list[str], log: Callable[[str], None]) -> None:
    log("$ " + " ".join(argv))
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr + "\n" + proc.stdout).splitlines()
                 if ln.strip() and "is ignored: it is neither a file nor a directory" not in ln]
        errors = [ln for ln in lines if "ERROR" in ln or "Error" in ln] or lines
        raise EnvBuildError("; ".join(ln.strip() for ln in errors[-6:])[:2000] or f"exit {proc.returncode}")


_CHECK = """
import importlib, importlib.metadata as md, json, sys
out = {"python": sys.version.split()[0], "packages": {}, "plugins": {}, "import_errors": {}}
for d in md.distributions():
    out["packages"][d.metadata["Name"].lower()] = d.version
for mod in ["tuning.sft_trainer"] + sys.argv[2:]:
    try:
        importlib.import_module(mod)
    except Exception as exc:
        out["import_errors"][mod] = f"{type(exc).__name__}: {exc}"[:500]
import torch
out["torch"] = {"version": torch.__version__, "cuda": torch.version.cuda}
open(sys.argv[1], "w").write(json.dumps(out))
"""


def _check(python: Path, plugins: list[str], log: Callable[[str], None]) -> dict[str, Any]:
    """Import the trainer (and the plugins) inside the environment; what is installed, and torch's build."""
    out = python.parent.parent / ".sbench-check.json"
    _run([str(python), "-c", _CHECK, str(out), *(PLUGINS[p] for p in plugins)], log)
    doc = json.loads(out.read_text())
    out.unlink()
    if doc["import_errors"]:
        raise EnvBuildError("installed, but does not import: " + "; ".join(
            f"{m}: {e}" for m, e in doc["import_errors"].items()))
    return doc


def build(version: str, root: Path, *, extras: tuple[str, ...] = (), force: bool = False, refresh: bool = False,
          log: Callable[[str], None] = lambda s: None) -> tuple[TrainerEnv, str]:
    """Make ``fms-hf-tuning==version`` (with *extras*) ready under *root*; returns the environment and
    what was done: ``ready`` (nothing to do), ``built``, ``extended`` (plugins added) or ``refreshed``
    (*refresh*: the package list read again after a hand-made change, e.g. flash-attn installed)."""
    for x in extras:
        if x not in EXTRAS:
            raise InputError(f"env build: unknown extra {x!r}; known: {', '.join(EXTRAS)}")
    name = env_name(version)
    with _lock(root, name):
        env = lookup(version, root)
        want_plugins = list(PLUGINS) if "fms-accel" in extras else []
        if env.built and not force and all(p in env.plugins() for p in want_plugins):
            if not refresh:
                return env, "ready"
            doc = _check(env.python, [p for p in PLUGINS if p in env.plugins()], log)
            manifest = dict(env.manifest or {}, packages=doc["packages"], torch=doc["torch"], refreshed_at=time.time())
            (env.path / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
            return lookup(version, root), "refreshed"
        t0 = time.monotonic()
        failed = root / f"{name}.failed.json"
        target = env.path
        fresh = force or not env.built
        work = root / f".{name}.tmp-{os.getpid()}" if fresh else target
        try:
            if fresh:
                shutil.rmtree(work, ignore_errors=True)
                _run([sys.executable, "-m", "venv", str(work)], log)
            py = work / "bin" / "python"
            req = f"{PACKAGE}[fms-accel]=={version}" if want_plugins else f"{PACKAGE}=={version}"
            cons: list[str] = []
            if want_plugins:
                cf = work / "sbench-constraints.txt"
                cf.write_text("\n".join(ACCEL_CONSTRAINTS) + "\n")
                cons = ["-c", str(cf)]
            # The CPU-only torch of sbench's own environment is not used: the release's pin decides.
            _run([str(py), "-m", "pip", "install", "--disable-pip-version-check", "--no-input", req,
                  *want_plugins, *cons], log)
            doc = _check(py, want_plugins, log)
        except (EnvBuildError, OSError) as exc:
            if fresh:
                shutil.rmtree(work, ignore_errors=True)
            reason = str(exc)
            failed.write_text(json.dumps({"version": version, "extras": list(extras), "reason": reason,
                                          "at": time.time()}, indent=2) + "\n")
            raise EnvBuildError(f"{PACKAGE}=={version}{'[' + ','.join(extras) + ']' if extras else ''} could not be "
                                f"built in {target}: {reason}") from None
        manifest = {"package": PACKAGE, "version": version, "extras": sorted(set(extras) | set(
                        (env.manifest or {}).get("extras") or [])),
                    "plugins": {p: doc["packages"].get(p) for p in PLUGINS if p in doc["packages"]},
                    "python": doc["python"], "torch": doc["torch"],
                    "trainer_packages": {k: doc["packages"].get(k) for k in
                                         ("fms-hf-tuning", "torch", "transformers", "trl", "peft", "accelerate",
                                          "datasets", "fms-acceleration")},
                    "packages": doc["packages"], "built_at": time.time(),
                    "build_seconds": round(time.monotonic() - t0, 1), "constraints": list(ACCEL_CONSTRAINTS)
                    if want_plugins else []}
        (work / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        if fresh:
            if target.exists():
                shutil.rmtree(target)
            os.replace(work, target)
        failed.unlink(missing_ok=True)
        return lookup(version, root), "built" if fresh else "extended"


def features_of(method: str, entity: dict[str, Any]) -> list[str]:
    """The acceleration features a point asks for (keys of FEATURE_PLUGINS)."""
    out = []
    if method == "gptq-lora":
        out.append("gptq-lora")
    if entity.get("fast_kernels") and any(str(x).lower() == "true" for x in entity["fast_kernels"]):
        out.append("fast_kernels")
    if int(entity.get("fast_moe") or 0) > 0:
        out.append("fast_moe")
    return out
