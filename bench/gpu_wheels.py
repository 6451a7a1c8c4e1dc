"""The wheels the GPU check carries to a machine without network, and their installation there.

The lent GPU machine (docs/gpu-check.md) has CPython 3.12 with torch, transformers, accelerate, peft, psutil,
pyyaml, jinja2, click, nvidia-ml-py, pyarrow and pillow (:data:`MACHINE_PACKAGES`), and their own dependencies;
it lacks the rest of sbench's runtime dependencies (``pyproject.toml``: duckdb, trl, submitit, datasets, orjson,
and what they pull in: pandas, dill, multiprocess, xxhash, cloudpickle, ...). Three commands:

- ``download --dest .wheels`` (``make gpu-wheels``): the dependency closure of sbench's runtime requirements,
  minus the closure of :data:`MACHINE_PACKAGES` (both read from this environment's installed metadata), each
  pinned to the version installed here (the versions the tests run), plus :data:`FALLBACKS`; as CPython 3.12
  manylinux x86_64 wheels, without their dependencies (``pip download --no-deps``): nothing the machine has is
  downloaded, torch above all;
- ``check --wheels .wheels``: the folder as the machine will see it, without installing anything: every wheel
  fits CPython 3.12 on manylinux x86_64, every requirement of a carried wheel is carried or is one of the
  machine's packages, and the folder stays within :data:`MAX_BYTES`;
- ``install --wheels .wheels --target DIR`` (on the machine): walks sbench's requirements against what this
  interpreter has installed; a requirement it satisfies is left alone, any other is taken from the folder (of
  several versions of one package, the one whose own requirements the machine meets best: a machine whose
  huggingface_hub is too old for the newest datasets gets the fallback one) into *DIR* with ``pip install
  --no-index --no-deps --target``, which the check puts first on ``PYTHONPATH``. A requirement that neither the
  machine nor the folder satisfies is named, and the command exits 1 before any GPU time is spent.
"""

from __future__ import annotations

import argparse
import email.parser
import importlib.metadata as md
import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import tomllib
from packaging.requirements import InvalidRequirement, Requirement
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
# What the lent GPU machine has installed (docs/gpu-check.md), with their own dependencies.
MACHINE_PACKAGES = ("torch", "transformers", "accelerate", "peft", "psutil", "pyyaml", "jinja2", "click",
                    "nvidia-ml-py", "pyarrow", "pillow")
# Carried beside the tested versions: datasets 5.0.0 is the newest release that still accepts a huggingface_hub
# older than 1.31 (the newer ones import its storage-bucket API), which a machine set up with an older
# transformers 5 has; it imports requests and httpx, which such a machine may lack (its huggingface_hub 1.x
# brings httpx; carried all the same, so that the folder is complete whatever the hub).
# accelerate and peft: newer than a machine's own where that is too old for the carried trl (it needs accelerate
# 1.10.1); installed only then.
FALLBACKS = ("accelerate==1.15.0", "peft==0.21.2", "datasets==5.0.0", "requests==2.34.2", "urllib3==2.8.0",
             "charset-normalizer==3.5.3", "idna==3.20", "certifi==2026.10.19.post1", "httpx==0.28.1",
             "httpcore==1.0.9", "h11==0.16.0", "anyio==4.16.0", "sniffio==1.3.1")
PYTHON = (3, 12)
ARCH = "x86_64"
# A manylinux wheel for glibc 2.17 .. 2.39 runs there (CUDA 13's torch wheels need 2.28 already).
PLATFORMS = ([f"manylinux_2_{n}_{ARCH}" for n in range(39, 4, -1)]
             + [f"manylinux2014_{ARCH}", f"manylinux2010_{ARCH}", f"manylinux1_{ARCH}", f"linux_{ARCH}"])
# The folder and the working tree travel together within 64 MiB; the tree is a few MiB.
MAX_BYTES = 56 * 2**20
CARRY_LIMIT = 64 * 2**20


def target_tags() -> set[Tag]:
    """The wheel tags CPython 3.12 on manylinux x86_64 accepts."""
    py = f"cp{PYTHON[0]}{PYTHON[1]}"
    return set(cpython_tags(PYTHON, abis=[py, "abi3", "none"], platforms=PLATFORMS)) | \
        set(compatible_tags(PYTHON, py, platforms=PLATFORMS))


def target_environment() -> dict[str, str]:
    """The marker environment of the machine: CPython 3.12 on Linux x86_64."""
    return {"python_version": f"{PYTHON[0]}.{PYTHON[1]}", "python_full_version": f"{PYTHON[0]}.{PYTHON[1]}.0",
            "implementation_name": "cpython", "implementation_version": f"{PYTHON[0]}.{PYTHON[1]}.0",
            "platform_python_implementation": "CPython", "sys_platform": "linux", "platform_system": "Linux",
            "platform_machine": ARCH, "os_name": "posix", "platform_release": "", "platform_version": "",
            "extra": ""}


def requirements_of(lines: Iterable[str], env: dict[str, str] | None) -> list[Requirement]:
    """The requirements among *lines* whose marker holds in *env* (the running interpreter's when None); a
    requirement of an extra never holds (extras are not installed)."""
    out = []
    for line in lines:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.marker is not None and not req.marker.evaluate({**(env or {}), "extra": ""} if env else {"extra": ""}):
            continue
        out.append(req)
    return out


# Runtime requirements a GPU node of the check never imports, so never carried: sbench imports them only where it
# draws a report (harness.report.charts), which the check does not; the wheel alone would take the folder past
# MAX_BYTES.
NOT_CARRIED = {"vl-convert-python": "the report's chart library (about 30 MB): the GPU check draws no report"}


def sbench_requirements(env: dict[str, str] | None = None) -> list[Requirement]:
    """sbench's runtime requirements (``pyproject.toml``'s ``[project] dependencies``) that a GPU node of the check
    imports: all but :data:`NOT_CARRIED`."""
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return [r for r in requirements_of(doc["project"]["dependencies"], env)
            if canonicalize_name(r.name) not in NOT_CARRIED]


@dataclass(frozen=True)
class Wheel:
    path: Path
    name: str  # canonical
    version: Version
    tags: frozenset[Tag]
    requires: tuple[str, ...] = field(default=())

    @classmethod
    def read(cls, path: Path) -> Wheel:
        name, version, _build, tags = parse_wheel_filename(path.name)
        with zipfile.ZipFile(path) as z:
            meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
            msg = email.parser.Parser().parsestr(z.read(meta).decode("utf-8", "replace"))
        return cls(path, canonicalize_name(name), version, frozenset(tags), tuple(msg.get_all("Requires-Dist") or ()))

    def fits(self, tags: set[Tag]) -> bool:
        return bool(self.tags & tags)


def read_wheels(folder: Path) -> list[Wheel]:
    return [Wheel.read(p) for p in sorted(folder.glob("*.whl"))] if folder.is_dir() else []


def installed_version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def closure(roots: Iterable[str], env: dict[str, str] | None = None) -> dict[str, str]:
    """``{canonical name: installed version}`` of *roots* and everything they require, transitively, as this
    environment has them installed (a requirement not installed here is left out)."""
    out: dict[str, str] = {}
    todo = [canonicalize_name(Requirement(r).name) for r in roots]
    while todo:
        name = todo.pop()
        if name in out:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        out[name] = dist.version
        todo += [canonicalize_name(r.name) for r in requirements_of(dist.requires or (), env)]
    return out


@dataclass
class Plan:
    """What ``install`` takes from the folder, and what it could not satisfy."""

    chosen: dict[str, Wheel] = field(default_factory=dict)
    kept: dict[str, str] = field(default_factory=dict)  # name -> the machine's version, which satisfies
    missing: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def plan_install(roots: list[Requirement], installed: Callable[[str], str | None], wheels: list[Wheel],
                 tags: set[Tag], env: dict[str, str] | None) -> Plan:
    """Walk *roots* against the machine (*installed*: a name's installed version, or None): what to take from
    *wheels* so that every requirement is met (see the module docstring)."""
    plan = Plan()
    fitting = [w for w in wheels if w.fits(tags)]
    todo: list[tuple[Requirement, str]] = [(r, "sbench") for r in roots]
    while todo:
        req, parent = todo.pop(0)
        name = canonicalize_name(req.name)
        if name in plan.chosen:
            if not req.specifier.contains(plan.chosen[name].version, prereleases=True):
                plan.warnings.append(f"{parent} asks {req}; the carried {name} is {plan.chosen[name].version}")
            continue
        have = installed(name)
        if have is not None and req.specifier.contains(have, prereleases=True):
            plan.kept.setdefault(name, have)
            continue
        cands = [w for w in fitting if w.name == name and req.specifier.contains(w.version, prereleases=True)]
        if not cands:
            if have is not None:
                plan.warnings.append(f"{parent} asks {req}; the machine has {name} {have} and no carried wheel fits: "
                                     "kept as it is")
                plan.kept.setdefault(name, have)
            else:
                plan.missing.append(f"{req} (asked by {parent})")
            continue

        def unmet(w: Wheel) -> int:
            return sum(_shortfall(r, installed, fitting) for r in requirements_of(w.requires, env))

        best = min(cands, key=lambda w: (unmet(w), _newest_first(w)))
        plan.chosen[name] = best
        if have is not None:
            plan.warnings.append(f"{parent} asks {req}; the machine has {name} {have}: the carried {best.version} "
                                 "goes first on the path")
        todo += [(r, f"{name} {best.version}") for r in requirements_of(best.requires, env)]
    return plan


def _shortfall(r: Requirement, installed: Callable[[str], str | None], carried: list[Wheel]) -> int:
    """How badly requirement *r* goes unmet by the machine and the carried wheels: 0 met; 1 only by an upper
    bound (a pin against releases that did not exist yet, which usually still work); 10 by a lower bound (the
    package needs what a newer release added: an import fails); 100 nothing there at all."""
    name = canonicalize_name(r.name)
    versions = [v for v in [installed(name)] if v is not None] + [str(w.version) for w in carried if w.name == name]
    if not versions:
        return 100
    if any(r.specifier.contains(v, prereleases=True) for v in versions):
        return 0
    lower = [s for s in r.specifier if s.operator in (">=", ">", "==", "~=", "===")]
    return 10 if any(not s.contains(v, prereleases=True) for s in lower for v in versions) else 1


def _newest_first(w: Wheel) -> tuple[int, ...]:
    return tuple(-x for x in w.version.release)


def check_folder(folder: Path) -> list[str]:
    """What is wrong with *folder* for the machine (empty: nothing): see ``check`` in the module docstring."""
    wheels = read_wheels(folder)
    if not wheels:
        return [f"{folder}: no wheels (run make gpu-wheels)"]
    tags, env = target_tags(), target_environment()
    problems = [f"{w.path.name}: not a wheel for CPython 3.12 on manylinux {ARCH}" for w in wheels if not w.fits(tags)]
    machine = closure(MACHINE_PACKAGES, env)
    carried = {w.name for w in wheels}
    for w in wheels:
        for r in requirements_of(w.requires, env):
            name = canonicalize_name(r.name)
            if name not in carried and name not in machine:
                problems.append(f"{w.path.name} requires {r}: neither carried nor one of the machine's packages")
    for r in sbench_requirements(env):
        name = canonicalize_name(r.name)
        if name not in carried and name not in machine:
            problems.append(f"sbench requires {r}: neither carried nor one of the machine's packages")
    # What install would do there, if the machine had its packages at the versions installed here.
    plan = plan_install(sbench_requirements(env), machine.get, wheels, tags, env)
    problems += [f"on the machine, install would miss {m}" for m in plan.missing]
    size = sum(w.path.stat().st_size for w in wheels)
    if size > MAX_BYTES:
        problems.append(f"{folder}: {size / 2**20:.1f} MiB of wheels, more than {MAX_BYTES / 2**20:.0f} MiB (the "
                        "tree travels in the same 64 MiB)")
    return problems


def tree_bytes(root: Path = ROOT) -> int | None:
    """Bytes of the working tree as it travels: tracked files and untracked ones git does not ignore (not .venv,
    results/ or .wheels); None outside a git checkout."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                             capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return sum((root / n).stat().st_size for n in out.decode().split("\0") if n and (root / n).is_file())


def download_list(env: dict[str, str] | None = None) -> list[str]:
    """``name==version`` of every package the folder carries: sbench's closure minus the machine's, at the
    versions installed here, and the fallbacks."""
    roots = [str(r) for r in sbench_requirements(env)]
    mine, machine = closure(roots, env), closure(MACHINE_PACKAGES, env)
    pins = [f"{n}=={v}" for n, v in sorted(mine.items()) if n not in machine and n != "sbench"]
    missing = [canonicalize_name(r.name) for r in sbench_requirements(env) if canonicalize_name(r.name) not in mine]
    if missing:
        raise SystemExit(f"not installed here, so no version to pin: {', '.join(missing)} (run make setup)")
    return pins + list(FALLBACKS)


def download(dest: Path) -> int:
    pins = download_list(target_environment())
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
           "--python-version", f"{PYTHON[0]}.{PYTHON[1]}", "--implementation", "cp",
           "--abi", f"cp{PYTHON[0]}{PYTHON[1]}", "--abi", "abi3", "--abi", "none", "--dest", str(dest)]
    cmd += [x for p in PLATFORMS for x in ("--platform", p)]
    # One pip per pin: pip refuses two versions of one package (datasets and its fallback) in one resolution.
    for pin in pins:
        rc = subprocess.call([*cmd, pin])
        if rc:
            print(f"pip download {pin} failed (exit {rc})", file=sys.stderr)
            return rc
    wanted = {canonicalize_name(p.split("==")[0]) + "==" + p.split("==")[1] for p in pins}
    for w in read_wheels(dest):  # a wheel of an earlier pin set: not carried any more
        if f"{w.name}=={w.version}" not in wanted:
            w.path.unlink()
            print(f"removed {w.path.name} (no longer pinned)")
    return 0


def install(folder: Path, target: Path, *, dry_run: bool = False, roots: list[Requirement] | None = None,
            use_pip: bool | None = None) -> int:
    """Install what this interpreter lacks of *roots* (sbench's requirements) from *folder* into *target*; prints
    a JSON report; exit 1 when something is missing. *use_pip* None: pip when this interpreter has it, else the
    wheels are unpacked (a wheel is a zip of what goes on the path; its tags were checked)."""
    wheels = read_wheels(folder)
    plan = plan_install(sbench_requirements() if roots is None else roots, installed_version, wheels,
                        set(_running_tags()), None)
    report = {"python": sys.version.split()[0], "wheels_folder": str(folder), "wheels_found": len(wheels),
              "install": {n: str(w.version) for n, w in sorted(plan.chosen.items())},
              "kept": dict(sorted(plan.kept.items())), "missing": plan.missing, "warnings": plan.warnings,
              "target": str(target), "dry_run": dry_run}
    print(json.dumps(report, indent=2))
    if plan.missing:
        print(f"gpu_wheels: missing, neither installed nor in {folder}: {'; '.join(plan.missing)}", file=sys.stderr)
        return 1
    if dry_run or not plan.chosen:
        return 0
    target.mkdir(parents=True, exist_ok=True)
    files = [w.path for w in plan.chosen.values()]
    if use_pip is None:
        use_pip = subprocess.call([sys.executable, "-m", "pip", "--version"], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL) == 0
    if use_pip:
        env = {**os.environ, "PIP_BREAK_SYSTEM_PACKAGES": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        # pip's own words go to stderr: stdout is the report, which the driver keeps as wheels.json
        return subprocess.call([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                                "--upgrade", "--target", str(target), *map(str, files)], env=env, stdout=2)
    for f in files:
        unpack(f, target)
        print(f"unpacked {f.name} (no pip for this python)", file=sys.stderr)
    return 0


def unpack(wheel: Path, target: Path) -> None:
    """Put a wheel's files on a path folder as pip would: the root's, and ``*.data/purelib|platlib``'s."""
    with zipfile.ZipFile(wheel) as z:
        for member in z.namelist():
            parts = member.split("/")
            if member.endswith("/"):
                continue
            if parts[0].endswith(".data"):
                if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                    continue  # scripts, headers, data: not needed on the path
                parts = parts[2:]
            out = target.joinpath(*parts)
            if target.resolve() not in out.resolve().parents:
                raise SystemExit(f"{wheel.name}: {member} would land outside {target}")
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(z.read(member))


def _running_tags() -> Iterable[Tag]:
    from packaging.tags import sys_tags  # the running interpreter's own

    return sys_tags()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("download", help="download the carried wheels (make gpu-wheels)")
    d.add_argument("--dest", type=Path, default=ROOT / ".wheels")
    c = sub.add_parser("check", help="check the folder for the machine, installing nothing")
    c.add_argument("--wheels", type=Path, default=ROOT / ".wheels")
    i = sub.add_parser("install", help="on the machine: install what it lacks into --target")
    i.add_argument("--wheels", type=Path, default=ROOT / ".wheels")
    i.add_argument("--target", type=Path, required=True)
    i.add_argument("--dry-run", action="store_true", help="say what would be installed, install nothing")
    args = ap.parse_args(argv)
    if args.cmd == "download":
        rc = download(args.dest)
        if rc:
            return rc
        args.wheels = args.dest
    if args.cmd in ("download", "check"):
        problems = check_folder(args.wheels)
        size = sum(p.stat().st_size for p in args.wheels.glob("*.whl")) if args.wheels.is_dir() else 0
        tree = tree_bytes()
        carried = "" if tree is None else (f"; with the working tree ({tree / 2**20:.1f} MiB) "
                                           f"{(size + tree) / 2**20:.1f} MiB of the {CARRY_LIMIT / 2**20:.0f} MiB a "
                                           "lent machine takes")
        print(f"{args.wheels}: {len(list(args.wheels.glob('*.whl')))} wheels, {size / 2**20:.1f} MiB{carried}")
        env = target_environment()
        plan = plan_install(sbench_requirements(env), closure(MACHINE_PACKAGES, env).get, read_wheels(args.wheels),
                            target_tags(), env)
        print("  on a machine with this environment's versions of its packages, install would take: "
              + (", ".join(f"{n} {w.version}" for n, w in sorted(plan.chosen.items())) or "nothing"))
        if tree is not None and size + tree > CARRY_LIMIT:
            problems.append(f"wheels and working tree: {(size + tree) / 2**20:.1f} MiB > {CARRY_LIMIT / 2**20:.0f} MiB")
        for p in problems:
            print(f"  problem: {p}")
        return 1 if problems else 0
    return install(args.wheels, args.target, dry_run=args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
