"""Trainer environments: one virtual environment per fms-hf-tuning release, built once, shared by the nodes.

fms-hf-tuning pins its own torch, transformers, trl and peft (3.2.2: torch 2.8, transformers 4.55,
trl 0.19, peft 0.19), so it cannot share sbench's environment. ``sbench env build fms-hf-tuning==X``
(and ``sbench prepare``) builds ``<envs_dir>/fms-hf-tuning-X``:

- a venv of the interpreter sbench runs on, with ``fms-hf-tuning==X`` installed by pip: what that
  release pins is what the environment holds, with one constraint for a conflict pip cannot see
  (``CONSTRAINTS``: pyarrow must still import beside the numpy the release pins);
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
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from harness.build.trainargs import smoke_argv
from harness.contract import envvars
from harness.contract.errors import InputError, SbenchError
from harness.contract.paths import JobPaths, dataset_filename, package_dir
from harness.spec.catalog import fms_version
from harness.spec.envs import EXTRAS, MANIFEST, PACKAGE, PLUGINS, TrainerEnv, env_name, lookup

from .datagen import generate_dataset
from .tinymodel import make_tiny_model

# Runtime conflicts pip cannot see, found by the import check: older releases and the plugins pin
# numpy<2, and pyarrow declares no numpy requirement although pyarrow >= 22 refuses numpy 1.x at import.
CONSTRAINTS = ("pyarrow<22",)


class EnvBuildError(SbenchError):
    """pip or the import check failed; the message holds the reason (exit 1)."""


def parse_spec(text: str) -> str:
    """``fms-hf-tuning==3.2.2`` -> ``3.2.2``; anything else is an input error naming the form."""
    name, sep, version = str(text).partition("==")
    if name.strip() != PACKAGE or not sep:
        raise InputError(f"env build: expected {PACKAGE}==VERSION (e.g. {PACKAGE}==3.2.2), got {text!r}")
    try:
        return fms_version(version.strip())
    except ValueError as exc:
        raise InputError(f"env build: {exc}") from None


_PIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}(\[[A-Za-z0-9,._-]+\])?"
                  r"(\s*(==|<=|>=|<|>|!=|~=)\s*[A-Za-z0-9.*+!_-]{1,60}"
                  r"(\s*,\s*(==|<=|>=|<|>|!=|~=)\s*[A-Za-z0-9.*+!_-]{1,60})*)?")


def read_pins(path: Path) -> tuple[str, ...]:
    """A requirements file's lines (``name`` or ``name==1.2.3``; comments and blank lines skipped);
    anything pip would take as an option or a URL is an input error naming the line."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read the requirements file: {exc}") from None
    if len(lines) > 5000:
        raise InputError(f"{path}: more than 5000 lines; a requirements file lists packages")
    out = []
    for n, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if not _PIN.fullmatch(line):
            raise InputError(f"{path}:{n}: {line[:80]!r} is not a requirement like name==1.2.3 (options and URLs "
                             "are not accepted)")
        out.append(line)
    return tuple(out)


@contextlib.contextmanager
def _lock(root: Path, name: str) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{name}.lock", "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _run(argv: list[str], log: Callable[[str], None], shown: str | None = None) -> None:
    log("$ " + (shown or " ".join(argv)))
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
    mods = ["tuning.sft_trainer", *(PLUGINS[p] for p in plugins)]
    _run([str(python), "-c", _CHECK, str(out), *mods[1:]], log, f"{python} -c 'import {', '.join(mods)}'")
    doc = json.loads(out.read_text())
    out.unlink()
    if doc["import_errors"]:
        raise EnvBuildError("installed, but does not import: " + "; ".join(
            f"{m}: {e}" for m, e in doc["import_errors"].items()))
    return doc


SMOKE_STEPS = 2
SMOKE_DATASET = "news-chars-512-entries-4096"


def _smoke(python: Path, work: Path, log: Callable[[str], None]) -> float:
    """Train the tiny model for a few steps on the CPU with sbench's entry point in the environment, as a
    job will: a release whose pins resolve and import but cannot train (an old release beside a newer
    trl, say) fails its build here, with the error, instead of failing every job. Returns seconds."""
    t0 = time.monotonic()
    tmp = work / ".sbench-smoke"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model = make_tiny_model(tmp / "model")
        data = tmp / "data" / dataset_filename(SMOKE_DATASET)
        generate_dataset(SMOKE_DATASET, data, entries=8)
        (tmp / "path").mkdir()
        os.symlink(package_dir(), tmp / "path" / "harness")
        job = tmp / "job"
        argv = [str(python), "-m", "harness.runner.fms", *smoke_argv(str(model), str(data), str(job), SMOKE_STEPS)]
        env = {k: v for k, v in os.environ.items()
               if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", envvars.FAULT.name)}
        env.update({"PYTHONPATH": str(tmp / "path"), "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1",
                    envvars.HOST.name: "smoke"})
        log(f"$ {python} -m harness.runner.fms (the tiny model, {SMOKE_STEPS} LoRA steps on the CPU)")
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
        doc: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):
            doc = json.loads(JobPaths(job).rank_result(0).read_text())
        if proc.returncode != 0 or doc.get("status") != "ok" or doc.get("global_step") != SMOKE_STEPS:
            error = doc.get("error")
            err: dict[str, Any] = error if isinstance(error, dict) else {}
            why = (f"{err.get('error_type')}: {err.get('message')}" if err else
                   "; ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:]))
            raise EnvBuildError(f"installed, but cannot train (a {SMOKE_STEPS}-step run of the tiny model on the "
                                f"CPU failed in stage {err.get('stage') or '?'}): {why}"[:2000])
    except subprocess.TimeoutExpired:
        raise EnvBuildError("installed, but a 2-step run of the tiny model did not end within 15 minutes") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return time.monotonic() - t0


def known_requirements(version: str) -> tuple[str, ...]:
    """What sbench installs with a release whose own pins no longer work (harness/data/fms_requirements.yaml)."""
    doc = yaml.safe_load(resources.files("harness.data").joinpath("fms_requirements.yaml").read_text()) or {}
    return tuple(str(x) for x in doc.get(version) or ())


def build(version: str, root: Path, *, extras: tuple[str, ...] = (), force: bool = False, refresh: bool = False,
          pins: tuple[str, ...] | None = None, log: Callable[[str], None] = lambda s: None) -> tuple[TrainerEnv, str]:
    """Make ``fms-hf-tuning==version`` (with *extras*) ready under *root*; returns the environment and
    what was done: ``ready`` (nothing to do), ``built``, ``extended`` (plugins added) or ``refreshed``
    (*refresh*: the package list read again after a hand-made change, e.g. flash-attn installed).
    *pins*: requirements installed with the release (``trl==0.11.4``, ``rich``), e.g. the exact package
    list a reference run used, for a release whose own pins no longer resolve to a working set; by default
    :func:`known_requirements`."""
    pins = known_requirements(version) if pins is None else tuple(pins)
    for x in extras:
        if x not in EXTRAS:
            raise InputError(f"env build: unknown extra {x!r}; known: {', '.join(EXTRAS)}")
    name = env_name(version)
    with _lock(root, name):
        env = lookup(version, root)
        want_plugins = list(PLUGINS) if "fms-accel" in extras else []
        # New requirements change what the environment is: build it again rather than patch it.
        force = force or bool(pins and list(pins) != list((env.manifest or {}).get("requirements") or []))
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
            cf = work / "sbench-constraints.txt"
            cf.write_text("\n".join(CONSTRAINTS) + "\n")
            # The CPU-only torch of sbench's own environment is not used: the release's pin decides.
            _run([str(py), "-m", "pip", "install", "--disable-pip-version-check", "--no-input", req,
                  *want_plugins, *pins, "-c", str(cf)], log)
            doc = _check(py, want_plugins, log)
            smoke_s = _smoke(py, work, log)
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
                    "build_seconds": round(time.monotonic() - t0, 1), "smoke_seconds": round(smoke_s, 1),
                    "constraints": list(CONSTRAINTS), "requirements": list(pins)}
        (work / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        if fresh:
            if target.exists():
                shutil.rmtree(target)
            os.replace(work, target)
        failed.unlink(missing_ok=True)
        return lookup(version, root), "built" if fresh else "extended"


