"""Render a JobSpec into the files of a job directory.

Rendering is pure: each function returns text. ``write_job_dir`` is the only
place that touches the disk. Every value that reaches a shell line goes
through ``shlex.quote``.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import time
from pathlib import Path
from typing import Any

import yaml

from harness import __version__
from harness.contract import envvars
from harness.contract.atomic import write_text
from harness.contract.errors import InputError, RenderError
from harness.contract.paths import SPEC_SCHEMA, JobPaths, job_dir_name, package_dir
from harness.spec.inventory import ENV_NAME, Inventory
from harness.spec.plan import PlannedPoint
from harness.spec.sweep import Sweep

from .jobspec import PORT_BASE, PORT_SPAN, JobSpec, build_jobspec
from .sbatch import comment_text, job_sbatch


def _envname(v: Any) -> str:
    if not ENV_NAME.fullmatch(str(v)):
        raise RenderError(f"environment variable name {str(v)!r} is not a valid name (letters, digits, _)")
    return str(v)


@functools.cache
def _environment() -> Any:
    """The templates' Jinja2 environment, made on the first render: Jinja2 is imported only by the commands
    that render (submit, render, retry), not by every command that merely loads this module."""
    import jinja2  # 0.015 s of imports that only a render needs, kept off the readers' start-up

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("harness", "templates"),
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # noqa: S701 - shell and YAML, not HTML; values are shell-quoted explicitly
        keep_trailing_newline=True,
    )
    env.filters["q"] = lambda v: shlex.quote(str(v))
    # Env files always single-quote, so a value such as NCCL_IB_HCA's '=mlx5_0' reads unambiguously.
    env.filters["sq"] = lambda v: "'" + str(v).replace("'", "'\"'\"'") + "'"
    env.filters["c"] = comment_text
    env.filters["envname"] = _envname
    return env


def _render(template: str, **values: Any) -> str:
    """*template* rendered with *values*; a template error is a :class:`RenderError`."""
    import jinja2

    try:
        return str(_environment().get_template(template).render(**values))
    except jinja2.TemplateError as exc:
        raise RenderError(f"{template}: {exc}") from exc


def _arg_pairs(argv: list[str]) -> list[tuple[str, str | None]]:
    pairs: list[tuple[str, str | None]] = []
    for tok in argv:
        if tok.startswith("--") or not pairs:
            pairs.append((tok, None))
        else:
            flag, vals = pairs[-1]
            q = shlex.quote(tok)
            pairs[-1] = (flag, q if vals is None else f"{vals} {q}")
    return pairs


def render_launch(spec: JobSpec) -> str:
    return _render(
        "launch.sh.j2", spec=spec, hosts=sorted(spec.host_env), arg_pairs=_arg_pairs(spec.train_argv),
        port_base=PORT_BASE, port_span=PORT_SPAN,
    )


def host_environment(spec: JobSpec, host: str) -> dict[str, str]:
    env = {
        envvars.CAMPAIGN.name: spec.campaign,
        envvars.POINT_ID.name: spec.point_id,
        envvars.REPEAT.name: str(spec.repeat),
        envvars.ATTEMPT.name: str(spec.attempt),
        envvars.PARTITION.name: spec.partition,
    }
    env.update(spec.env)
    env.update(spec.host_env[host])
    return env


def render_env(spec: JobSpec, host: str) -> str:
    return _render("env.sh.j2", spec=spec, host=host, env=host_environment(spec, host))


def render_accelerate(spec: JobSpec) -> str | None:
    if spec.accelerate_config is None:
        return None
    head = (f"# sbench {spec.sbench_version}: accelerate config for point {spec.point_id}, attempt {spec.attempt}.\n"
            "# launch.sh passes machine_rank, main_process_ip and main_process_port on the command line at run\n"
            "# time (from SLURM), overriding the values below.\n")
    return head + yaml.safe_dump(spec.accelerate_config, sort_keys=False, default_flow_style=False)


def _names(env: dict[str, str]) -> list[str]:
    return sorted(env)


def inventory_snapshot(inv: Inventory) -> dict[str, Any]:
    """The inventory as spec.json records it: every ``env:`` and ``nccl:`` map by its variable names only
    (a value may be a credential; ``env/<host>.sh``, mode 0600, is the one file that holds the values)."""
    doc = inv.to_dict()
    doc["env"], doc["nccl"] = _names(doc["env"]), _names(doc["nccl"])
    for part in doc["partitions"].values():
        part["env"] = _names(part["env"])
        for host in part["hosts"].values():
            host["env"] = _names(host["env"])
    return doc


def jobspec_record(spec: JobSpec) -> dict[str, Any]:
    """The JobSpec as spec.json records it: ``env`` and ``host_env`` by their variable names only."""
    doc = spec.to_dict()
    doc["env"] = _names(spec.env)
    doc["host_env"] = {host: _names(env) for host, env in spec.host_env.items()}
    return doc


def render_spec_json(spec: JobSpec, inv: Inventory, point: PlannedPoint, sweep: Sweep) -> str:
    doc = {
        "schema": SPEC_SCHEMA,
        "sbench_version": __version__,
        "rendered_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "campaign": spec.campaign,
        "sweep": {"source": sweep.source, "description": sweep.description},
        "point": point.to_dict(),
        "inventory": inventory_snapshot(inv),
        "jobspec": jobspec_record(spec),
    }
    return json.dumps(doc, indent=2, sort_keys=False, default=str) + "\n"


SECRET_MODE = 0o600  # env/<host>.sh: the one file that holds the inventory's env values
SECRET_DIR_MODE = 0o700


Rendered = dict  # Path -> (text, mode): every file of one job directory, not yet on disk


class Link(str):
    """A rendered symbolic link: the text is its target."""


def render_files(spec: JobSpec, inv: Inventory, point: PlannedPoint, sweep: Sweep) -> Rendered:
    """Every file of *spec*'s job directory as text; pure (nothing touches the disk)."""
    paths = JobPaths(spec.job_dir)
    files = {
        paths.spec: (render_spec_json(spec, inv, point, sweep), 0o644),
        paths.sbatch: (job_sbatch(spec), 0o755),
        paths.launch: (render_launch(spec), 0o755),
    }
    acc = render_accelerate(spec)
    if acc is not None:
        files[paths.accelerate] = (acc, 0o644)
    if spec.deepspeed_config is not None:
        files[paths.deepspeed] = (json.dumps(spec.deepspeed_config, indent=2) + "\n", 0o644)
    for host in spec.host_env:
        files[paths.env(host)] = (render_env(spec, host), SECRET_MODE)
    if spec.trainer_path:
        # Only sbench's package, not the environment it is installed in: the trainer's own torch,
        # transformers and trl must win.
        files[Path(spec.trainer_path) / "harness"] = (Link(str(package_dir())), 0o777)
    return files


def write_files(job_dir: str | Path, files: Rendered) -> JobPaths:
    paths = JobPaths(job_dir)
    try:
        paths.env_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(paths.env_dir, SECRET_DIR_MODE)
        for path, (text, mode) in files.items():
            if isinstance(text, Link):
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
                tmp.unlink(missing_ok=True)
                os.symlink(text, tmp)
                os.replace(tmp, path)
                continue
            write_text(path, text, mode)
    except OSError as exc:
        raise RenderError(f"cannot write job directory {paths.root}: {exc}") from None
    return paths


def write_job_dir(spec: JobSpec, inv: Inventory, point: PlannedPoint, sweep: Sweep) -> JobPaths:
    """Write every rendered file of *spec* into its job directory."""
    return write_files(spec.job_dir, render_files(spec, inv, point, sweep))


def prepare_points(sweep: Sweep, inv: Inventory, points: list[PlannedPoint], out_dir: str | Path,
                   attempts: dict[tuple[str, int], int] | None = None,
                   python: str | None = None, exclude: list[str] | None = None) -> list[tuple[JobSpec, Rendered]]:
    """Build and render (in memory) every valid point's job directory under *out_dir*: everything that
    can fail on a value fails here, before anything is written. *attempts* gives the attempt number per
    (point_id, repeat) (default 1); points not in it are skipped when it is given. *exclude*: nodes of the
    SLURM partition that are not inventory hosts (``harness.cluster.fit``)."""
    out = Path(out_dir).expanduser().resolve()
    done = []
    for p in points:
        if not p.valid:
            continue
        attempt = 1 if attempts is None else attempts.get((p.point_id, p.repeat))
        if attempt is None:
            continue
        job_dir = str(out / job_dir_name(p.point_id, p.repeat, attempt))
        try:
            spec = build_jobspec(sweep, inv, p, attempt, job_dir, python=python, exclude=exclude)
            files = render_files(spec, inv, p, sweep)
        except (RenderError, KeyError, ValueError, TypeError) as exc:
            raise InputError(f"{sweep.source}: point {p.point_id} (repeat {p.repeat}) cannot be rendered: {exc}; "
                             "nothing was written") from None
        done.append((spec, files))
    return done


def render_points(sweep: Sweep, inv: Inventory, points: list[PlannedPoint], out_dir: str | Path,
                  attempt: int = 1, python: str | None = None, exclude: list[str] | None = None) -> list[JobSpec]:
    """Render one job directory per valid point under *out_dir*; invalid points are skipped here and
    reported by the caller (they are part of the plan). Every directory is rendered in memory first,
    so a point that cannot be rendered leaves *out_dir* untouched."""
    attempts = {(p.point_id, p.repeat): attempt for p in points}
    prepared = prepare_points(sweep, inv, points, out_dir, attempts, python=python, exclude=exclude)
    for spec, files in prepared:
        write_files(spec.job_dir, files)
    return [spec for spec, _ in prepared]
