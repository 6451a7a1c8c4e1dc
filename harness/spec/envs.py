"""Trainer environments as ``plan`` and ``render`` see them: where they live, what a built one holds, and
which one a point needs. (``harness.data.trainerenv`` builds them.)

One virtual environment per fms-hf-tuning release, ``<envs_dir>/fms-hf-tuning-X``, described by its
``sbench-env.json`` (release, extras, plugins, every package's version, torch's CUDA build); a failed
build leaves ``<name>.failed.json`` with pip's reason, and the points that need it are invalid with it.

``envs_dir``: the inventory's ``defaults.envs_dir`` (it must be visible from the compute nodes), else
``$SBENCH_ENVS_DIR``, else ``~/.cache/sbench/envs``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.contract import envvars
from harness.spec.inventory import shared_dir

PACKAGE = "fms-hf-tuning"


MANIFEST = "sbench-env.json"


EXTRAS = ("fms-accel",)


# What each acceleration feature needs in the environment (distribution name -> import name).
PLUGINS = {"fms-acceleration-peft": "fms_acceleration_peft", "fms-acceleration-foak": "fms_acceleration_foak",
           "fms-acceleration-moe": "fms_acceleration_moe"}


FEATURE_PLUGINS = {"gptq-lora": ("fms-acceleration-peft", "fms-acceleration-foak"),
                   "fast_kernels": ("fms-acceleration-foak",), "fast_moe": ("fms-acceleration-moe",)}


FAST_MOE_SINCE = (2, 4, 0)  # the reference: --fast_moe is only supported from fms-hf-tuning 2.4.0
VISION_SINCE = (2, 8, 0)  # fms-hf-tuning tunes vision-language models (--dataset_image_field) from 2.8.0
# The release an fms-hf-tuning vision point runs when its sweep names none: the seed's default (2.1.2) cannot
# tune a vision-language model, and this is the release sbench's vision tests train with.
VISION_RELEASE = "3.2.2"


CPU_FSDP_ACCELERATE = (1, 6)  # FSDP v2 (fully_shard), the only FSDP that runs on CPU, arrived in accelerate 1.6


def envs_root(inv: Any = None) -> Path:
    """Where environments live (see the module doc)."""
    configured = shared_dir(getattr(inv, "envs_dir", None), inv) if inv is not None else None
    if configured is not None:
        return configured
    named = envvars.ENVS_DIR.get()
    if named:
        return Path(named).expanduser().resolve()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sbench" / "envs"


def env_name(version: str) -> str:
    return f"{PACKAGE}-{version}"


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

    def lacking(self, extras: Collection[str]) -> list[str]:
        """What a build with *extras* would add: everything when nothing is built, else missing plugins."""
        if not self.built:
            return [env_name(self.version)]
        return sorted(set(PLUGINS) - set(self.plugins())) if "fms-accel" in extras else []

    def failed_reason(self, extras: tuple[str, ...] = ()) -> str | None:
        """The recorded failure, when it concerns a build this point needs."""
        f = self.failure
        if not f:
            return None
        if f.get("extras") and not extras and self.built:
            return None  # the plain environment is fine; only adding the plugins failed
        return str(f.get("reason") or "unknown reason")


def release_of(text: str | None) -> tuple[int, ...]:
    """The leading numeric release of a version string (``2.8.0+cu128`` -> (2, 8, 0)); () when none."""
    m = re.match(r"\d+(\.\d+)*", str(text or ""))
    return tuple(int(x) for x in m.group(0).split(".")) if m else ()


def env_version(env: TrainerEnv, package: str) -> str | None:
    """A built environment's version of *package*, or None."""
    pk = {k.lower(): v for k, v in ((env.manifest or {}).get("packages") or {}).items()}
    return pk.get(package.lower())


def env_has(env: TrainerEnv, package: str) -> bool:
    """Whether a built environment holds *package* (its distribution name, any case)."""
    return env_version(env, package) is not None


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
    return [lookup(v, root) for v in sorted(versions, key=release_of)]


def needed(method: str, points: Iterable[Any]) -> dict[str, set[str]]:
    """Release -> extras the valid fms-hf-tuning points of an experiment need."""
    need: dict[str, set[str]] = {}
    for p in points:
        if p.valid and p.entity.get("trainer") == PACKAGE:
            extras = need.setdefault(str(p.entity.get("fms_hf_tuning_version")), set())
            if features_of(method, p.entity):
                extras.add("fms-accel")
    return need


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
