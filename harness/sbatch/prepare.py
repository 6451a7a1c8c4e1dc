"""``sbench prepare``: everything a sweep's jobs read, made ready once, before any allocation starts.

For the valid training points of a sweep (as ``submit`` would render them):

1. **dataset files**: generated into the sweep's ``data_dir`` (``harness.datagen``: locked,
   atomic, tokenizer-free, so one file serves every model);
2. **model weights**: a local directory must hold a config, a tokenizer and weights; an HF id
   must be in the shared model cache (inventory ``defaults.models_dir``, else the HF cache),
   where ``sbench model fetch ID`` puts it; a path that is not visible from here (a mount
   only the compute nodes have) is left to the job, with a note;
3. **training data and token counts**: for every (tokenizer, dataset, max length, text field,
   response template) the sweep uses, the tokenized rows the trainer consumes and their exact
   token counts (``harness.prepared``), stored read-only under ``<data_dir>/.prepared`` and
   ``<data_dir>/.token-counts`` and memory-mapped by the jobs.

Re-running is cheap: what is ready is only checked (a corrupted entry is rebuilt). ``--on
slurm`` runs the same command as one CPU job of the sweep's partition instead
(:func:`submit_prepare_job`); the sweep's job arrays then depend on it (``afterok``).
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.contract.errors import InputError, SbenchError

MODEL_WEIGHTS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf", "model.safetensors.index.json",
                 "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json", "spiece.model")
PREPARE_TIME = "02:00:00"  # --on slurm: the preparation job's time limit unless the sweep sets one
PREPARE_CPUS = 16  # --on slurm: cores the preparation job asks for (the tokenizer uses them all)


@dataclass(frozen=True)
class TrainInput:
    """What one training job tokenizes: the key of its prepared data (minus the file contents)."""

    model: str
    dataset_id: str
    dataset_path: str
    max_seq_length: int
    text_field: str
    response_template: str


@dataclass
class Work:
    datasets: dict[str, str] = field(default_factory=dict)  # dataset path -> id
    models: dict[str, list[str]] = field(default_factory=dict)  # source -> model names
    inputs: list[TrainInput] = field(default_factory=list)
    data_dir: Path = Path(".")
    models_dir: str | None = None
    points: int = 0
    envs: dict[str, set[str]] = field(default_factory=dict)  # fms-hf-tuning release -> extras
    envs_root: Path = Path(".")


@dataclass
class Item:
    kind: str  # dataset | model | training_data
    name: str
    status: str  # ready | generated | built | rebuilt | not_visible
    seconds: float
    detail: str = ""
    info: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "status": self.status, "seconds": round(self.seconds, 3),
                "detail": self.detail, **self.info}


def work_for(sweep: Any, inv: Any, points: list[Any]) -> Work:
    """The datasets, models and training inputs of the valid training points, read off their job specs."""
    from harness.build.jobspec import build_jobspec
    from harness.runner.train import parse_args
    from harness.spec.plan import data_dir_for, shared_dir

    models_dir = shared_dir(inv.models_dir, inv)
    from harness.data.trainerenv import envs_root, needed

    w = Work(data_dir=data_dir_for(sweep, inv), models_dir=str(models_dir) if models_dir else None,
             envs=needed(sweep.experiment.method, points) if sweep.runner.workload == "train" else {},
             envs_root=envs_root(inv))
    seen: set[TrainInput] = set()
    for p in points:
        if not p.valid or sweep.runner.workload != "train":
            continue
        spec = build_jobspec(sweep, inv, p, 1, "/nonexistent/sbench-prepare")
        args = parse_args(spec.train_argv)
        w.points += 1
        w.datasets.setdefault(spec.dataset_path, spec.dataset_id)
        names = w.models.setdefault(spec.model_source, [])
        if p.entity["model_name"] not in names:
            names.append(p.entity["model_name"])
        ti = TrainInput(args.model_name_or_path, spec.dataset_id, args.training_data_path, args.max_seq_length,
                        args.dataset_text_field, args.response_template)
        if ti not in seen and sweep.runner.token_cache:  # token_cache: false -> jobs tokenize in memory
            seen.add(ti)
            w.inputs.append(ti)
    return w


# -- models --------------------------------------------------------------------------------------------------
def check_model_dir(path: Path) -> list[str]:
    """What a model directory lacks for training: [] when config, tokenizer and weights are there."""
    missing = []
    if not (path / "config.json").is_file():
        missing.append("config.json")
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        missing.append("a tokenizer (tokenizer.json or tokenizer.model + tokenizer_config.json)")
    if not any(any(path.glob(g)) for g in MODEL_WEIGHTS):
        missing.append("weights (*.safetensors or *.bin)")
    return missing


def model_cache(models_dir: str | None) -> str | None:
    """The shared HF hub cache jobs read (HF_HUB_CACHE): the inventory's models_dir, else the environment's."""
    return models_dir or os.environ.get("HF_HUB_CACHE") or None


def resolve_model(source: str, names: list[str], models_dir: str | None) -> tuple[str, Path | None]:
    """``(status, directory)``: ``ready`` with the local directory, or ``not_visible`` (a path not mounted here).

    Raises InputError, naming the fix, for a local directory that lacks files and for an HF id
    that is not in the shared model cache.
    """
    from harness.spec.catalog import is_local_source
    from harness.spec.plan import _mount_visible

    names_s = ", ".join(names)
    if is_local_source(source):
        path = Path(source).expanduser()
        if not path.exists():
            if not _mount_visible(str(path)):
                return "not_visible", None
            raise InputError(f"model {names_s}: {path} does not exist; fix model_map: or create it (for a test model: "
                             f"sbench model tiny -o {path})")
        missing = check_model_dir(path)
        if missing:
            raise InputError(f"model {names_s}: {path} lacks {', '.join(missing)}; copy the full checkpoint there "
                             "or map the name to a complete directory in model_map:")
        return "ready", path
    cache = model_cache(models_dir)
    try:
        from huggingface_hub import snapshot_download

        local = snapshot_download(source, cache_dir=cache, local_files_only=True)
    except Exception:  # noqa: BLE001 - LocalEntryNotFoundError, bad ids, ...
        where = cache or "the default HF cache"
        raise InputError(
            f"model {names_s}: {source} is not in the shared model cache ({where}); fetch it once where the hub "
            f"is reachable: sbench model fetch {source}{' --cache ' + cache if cache else ''} (or copy the "
            "checkpoint to a directory and map the name to it in model_map:)") from None
    path = Path(local)
    missing = check_model_dir(path)
    if missing:
        raise InputError(f"model {names_s}: the cached snapshot {path} of {source} lacks {', '.join(missing)}; "
                         f"fetch it again: sbench model fetch {source}")
    return "ready", path


def fetch_model(model_id: str, cache: str | None) -> Path:
    """Download config, tokenizer and weights of an HF id into ``cache`` (the shared model cache)."""
    from harness.spec.catalog import is_local_source

    if is_local_source(model_id):
        raise InputError(f"{model_id} is a path, not an HF id; a local directory needs no fetching")
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        raise InputError(f"cannot fetch {model_id}: HF_HUB_OFFLINE=1 here; run the fetch where the hub is "
                         "reachable (with the same --cache), or copy the checkpoint and map it in model_map:")
    from huggingface_hub import snapshot_download

    try:
        local = snapshot_download(model_id, cache_dir=cache, allow_patterns=[
            "*.json", "*.safetensors", "*.model", "*.txt", "*.py", "tokenizer*", "*.tiktoken"])
    except Exception as exc:  # noqa: BLE001 - network errors, gated repos, unknown ids
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise SbenchError(f"cannot fetch {model_id} into {cache or 'the default HF cache'}: {first}. Without "
                          "hub access, copy the checkpoint to a directory every node can read and map the model "
                          "name to it in model_map:") from None
    missing = check_model_dir(Path(local))
    if missing:
        raise SbenchError(f"fetched {model_id} into {local}, but it lacks {', '.join(missing)}")
    return Path(local)


# -- running --------------------------------------------------------------------------------------------------
def run_prepare(work: Work, echo: Callable[[str], None] = lambda s: None) -> list[Item]:
    """Make everything in ``work`` ready; returns one item per dataset, model and training input."""
    from harness.data.datagen import make_dataset
    from harness.data.prepared import PREP_DIR, TOKEN_CACHE_DIR, ensure_prepared
    from harness.data.tokens import dataset_token_counts, load_tokenizer

    items: list[Item] = []
    for version, extras in sorted(work.envs.items()):
        from harness.data.trainerenv import build

        t0 = time.monotonic()
        env, status = build(version, work.envs_root, extras=tuple(sorted(extras)), log=echo)
        pk = (env.manifest or {}).get("trainer_packages") or {}
        detail = ", ".join(f"{k} {v}" for k, v in pk.items() if v)
        items.append(Item("trainer_env", f"fms-hf-tuning=={version}", status, time.monotonic() - t0, detail,
                          {"path": str(env.path), "extras": sorted(extras)}))
        echo(f"env      {status:<9} fms-hf-tuning=={version}  {env.path}  ({detail})")
    for path, dataset_id in work.datasets.items():
        t0 = time.monotonic()
        _, made = make_dataset(dataset_id, path)
        dt = time.monotonic() - t0
        size = Path(path).stat().st_size
        status = "generated" if made else "ready"
        detail = f"{size / 1e6:.1f} MB" + (f" at {size / 1e6 / dt:.1f} MB/s" if status == "generated" and dt else "")
        items.append(Item("dataset", dataset_id, status, dt, detail, {"path": path, "size_bytes": size}))
        echo(f"dataset  {status:<9} {dataset_id}  {path}  ({detail}, {dt:.1f} s)")
    local: dict[str, Path | None] = {}
    for source, names in work.models.items():
        t0 = time.monotonic()
        status, path = resolve_model(source, names, work.models_dir)
        local[source] = path
        detail = str(path) if path else "not visible from here: the jobs will load it on the compute nodes"
        items.append(Item("model", source, status, time.monotonic() - t0, detail, {"names": names}))
        echo(f"model    {status:<9} {source}  ({detail})")
    tokenizers: dict[str, Any] = {}
    for ti in work.inputs:
        path = local.get(ti.model)
        label = f"{Path(ti.dataset_path).name} @ {ti.max_seq_length} with {ti.model}"
        if path is None:
            items.append(Item("training_data", label, "not_visible", 0.0,
                              "the model is not visible here; each job prepares it (use --on slurm to prepare on "
                              "a compute node)"))
            echo(f"data     not_visible {label}")
            continue
        t0 = time.monotonic()
        tok = tokenizers.get(ti.model) or tokenizers.setdefault(ti.model, load_tokenizer(str(path)))
        prep = ensure_prepared(tok, ti.dataset_path, text_field=ti.text_field, max_seq_length=ti.max_seq_length,
                               response_template=ti.response_template, root=work.data_dir / PREP_DIR,
                               token_cache=work.data_dir / TOKEN_CACHE_DIR, open_dataset=False)
        counts = dataset_token_counts(tok, ti.dataset_path, text_field=ti.text_field,
                                      max_seq_length=ti.max_seq_length, cache_dir=work.data_dir / TOKEN_CACHE_DIR,
                                      dataset_sha=prep.doc["dataset_sha256"])
        dt = time.monotonic() - t0
        status = {"hit": "ready"}.get(prep.status, prep.status)
        detail = (f"{prep.rows} rows, {prep.tokens:,} tokens (counts: cache {counts.cache})"
                  + (f"; {prep.reason}" if prep.status == "rebuilt" else "")
                  + (f"; {prep.tokens / prep.build_s / 1e6:.2f}M tokens/s" if prep.build_s else ""))
        items.append(Item("training_data", label, status, dt, detail,
                          {"key": prep.key, "path": str(prep.path), "rows": prep.rows, "tokens": prep.tokens,
                           "token_counts_cache": counts.cache}))
        echo(f"data     {status:<9} {label}  ({detail}, {dt:.1f} s)")
    return items


def prepare_sweep(sweep_path: Path, inventory_path: Path | None = None, model_map: Path | None = None,
                  echo: Callable[[str], None] = lambda s: None) -> list[Item]:
    """Load, plan and prepare a sweep here (the login node, or inside the --on slurm job)."""
    from harness.spec.inventory import load_inventory
    from harness.spec.plan import load_sweep, plan_sweep

    inv = load_inventory(inventory_path)
    sweep = load_sweep(sweep_path, model_map)
    return run_prepare(work_for(sweep, inv, plan_sweep(sweep, inv)), echo)


# -- --on slurm ----------------------------------------------------------------------------------------------
def prepare_script(sweep: Any, inv: Any, sweep_path: Path, inventory_path: Path | None, model_map: Path | None,
                   out_dir: Path) -> str:
    """The sbatch script of the preparation job: one task on one node of the sweep's partition."""
    from harness.build.jobspec import scheduling, slurm_extra
    from harness.build.render import sbatch_directives

    part = inv.partition(sweep.partition)
    res: dict[str, Any] = {"job_name": f"sbench.{sweep.campaign}.prepare", "partition": part.slurm_partition,
                           "nodes": 1, "ntasks": 1, "cpus_per_task": max(2, min(PREPARE_CPUS, part.cpus_per_node)),
                           "time": sweep.slurm.time or part.time_limit or PREPARE_TIME,
                           **scheduling(sweep, part), **slurm_extra(sweep, part)}
    res["output"] = f"{out_dir}/prepare-%j.out"
    python = part.python or inv.python or sys.executable
    argv = [python, "-m", "harness", "prepare", str(sweep_path.resolve())]
    if inventory_path is not None:
        argv += ["-i", str(Path(inventory_path).resolve())]
    if model_map is not None:
        argv += ["--model-map", str(Path(model_map).resolve())]
    lines = ["#!/bin/bash", *[f"#SBATCH {d}" for d in sbatch_directives(res)],
             "# sbench: prepare the campaign's datasets, models and training data on a compute node", "set -e",
             *list(inv.setup) + list(part.setup), f"cd {shlex.quote(os.getcwd())}",
             "exec " + " ".join(shlex.quote(a) for a in argv), ""]
    return "\n".join(lines)


def submit_prepare_job(sweep: Any, inv: Any, sweep_path: Path, inventory_path: Path | None, model_map: Path | None,
                       campaign_dir: Path) -> str:
    """Submit the preparation job; returns its SLURM job id."""
    from .slurm import ScriptExecutor

    logs = campaign_dir / ".slurm"
    logs.mkdir(parents=True, exist_ok=True)
    script = prepare_script(sweep, inv, sweep_path, inventory_path, model_map, logs)
    job = ScriptExecutor(campaign_dir / ".submitit", script).submit_script()
    return str(job.job_id)
