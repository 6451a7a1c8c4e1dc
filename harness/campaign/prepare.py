"""``sbench prepare``: everything a sweep's jobs read, made ready once, before any allocation starts.

For the valid training points of a sweep (as ``submit`` would render them):

1. **dataset files**: generated into the sweep's ``data_dir`` (``harness.data.datagen``: locked,
   atomic, tokenizer-free, so one file serves every model);
2. **model weights**: a local directory must hold a config, a tokenizer and weights; an HF id
   must be in the shared model cache (inventory ``defaults.models_dir``, else the HF cache),
   where ``sbench model fetch ID`` puts it; a path that is not visible from here (a mount
   only the compute nodes have) is left to the job, with a note;
3. **training data and token counts**: for every (tokenizer, dataset, max length, text field,
   response template) the sweep uses, the tokenized rows the trainer consumes and their exact
   token counts (``harness.data.prepared``), stored read-only under ``<data_dir>/.prepared`` and
   ``<data_dir>/.token-counts`` and memory-mapped by the jobs.

Re-running is cheap: what is ready is only checked (a corrupted entry is rebuilt). ``--on
slurm`` runs the same command as one CPU job of the sweep's partition instead
(:func:`submit_prepare_job`); the sweep's job arrays then depend on it (``afterok``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.build.jobspec import build_jobspec
from harness.build.sbatch import prepare_sbatch
from harness.contract import jobstate, safefile
from harness.contract.formats import IMAGE_FIELD
from harness.contract.paths import CampaignPaths
from harness.contract.records import now_iso
from harness.data.datagen import make_dataset
from harness.data.models import resolve_model
from harness.data.prepared import (
    DATA_FILE,
    META_FILE,
    PREP_DIR,
    TOKEN_CACHE_DIR,
    ensure_prepared,
    read_stamp,
    write_stamp,
)
from harness.data.tokens import counts_file, dataset_token_counts, load_tokenizer
from harness.data.trainerenv import build
from harness.data.vision import load_processor, vision_counts_file, vision_token_counts
from harness.data.visionprep import ensure_vision_prepared
from harness.runner.cmdline import parse_args
from harness.slurm.client import Slurm
from harness.spec.envs import envs_root, needed
from harness.spec.inventory import load_inventory, shared_dir
from harness.spec.plan import plan_sweep
from harness.spec.sweep import data_dir_for, load_sweep


@dataclass(frozen=True)
class TrainInput:
    """What one training job tokenizes: the key of its prepared data (minus the file contents)."""

    model: str
    dataset_id: str
    dataset_path: str
    max_seq_length: int
    text_field: str
    response_template: str
    image_field: str | None = None  # a vision dataset: the tokens are the processor's, counted per entry


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
    models_dir = shared_dir(inv.models_dir, inv)

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
                        args.dataset_text_field, args.response_template, args.dataset_image_field)
        if ti not in seen and sweep.runner.token_cache:  # token_cache: false -> jobs tokenize in memory
            seen.add(ti)
            w.inputs.append(ti)
    return w


# -- running --------------------------------------------------------------------------------------------------
def run_prepare(work: Work, echo: Callable[[str], None] = lambda s: None) -> list[Item]:
    """Make everything in ``work`` ready; returns one item per dataset, model and training input."""
    items: list[Item] = []
    for version, extras in sorted(work.envs.items()):
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
        status, model_dir = resolve_model(source, names, work.models_dir)
        local[source] = model_dir
        detail = str(model_dir) if model_dir else \
            "not visible from here: the jobs will load it on the compute nodes"
        items.append(Item("model", source, status, time.monotonic() - t0, detail, {"names": names}))
        echo(f"model    {status:<9} {source}  ({detail})")
    tokenizers: dict[str, Any] = {}
    for ti in work.inputs:
        model_dir = local.get(ti.model)
        label = f"{Path(ti.dataset_path).name} @ {ti.max_seq_length} with {ti.model}"
        if model_dir is None:
            items.append(Item("training_data", label, "not_visible", 0.0,
                              "the model is not visible here; each job prepares it (use --on slurm to prepare on "
                              "a compute node)"))
            echo(f"data     not_visible {label}")
            continue
        t0 = time.monotonic()
        if ti.image_field:
            items.append(_prepare_vision(ti, model_dir, work.data_dir, label, t0, echo))
            continue
        root = work.data_dir / PREP_DIR
        # Unchanged inputs since the last full check: ready, without loading the tokenizer or hashing anything.
        ident = {"model": ti.model, "model_dir": str(model_dir), "dataset": ti.dataset_path,
                 "max_seq_length": ti.max_seq_length, "text_field": ti.text_field,
                 "response_template": ti.response_template}
        inputs = [Path(ti.dataset_path), model_dir]
        stamped, why = read_stamp(root, ident, inputs)
        if stamped is not None:
            dt = time.monotonic() - t0
            detail = f"{stamped['rows']} rows, {stamped['tokens']:,} tokens; inputs unchanged since the last check"
            items.append(Item("training_data", label, "ready", dt, detail,
                              {**stamped, "token_counts_cache": "hit", "stamp": "hit"}))
            echo(f"data     ready     {label}  ({detail}, {dt:.1f} s)")
            continue
        tok = tokenizers.get(ti.model) or tokenizers.setdefault(ti.model, load_tokenizer(str(model_dir)))
        prep = ensure_prepared(tok, ti.dataset_path, text_field=ti.text_field, max_seq_length=ti.max_seq_length,
                               response_template=ti.response_template, root=root,
                               token_cache=work.data_dir / TOKEN_CACHE_DIR, open_dataset=False)
        counts = dataset_token_counts(tok, ti.dataset_path, text_field=ti.text_field,
                                      max_seq_length=ti.max_seq_length, cache_dir=work.data_dir / TOKEN_CACHE_DIR,
                                      dataset_sha=prep.doc["dataset_sha256"])
        dt = time.monotonic() - t0
        status = {"hit": "ready"}.get(prep.status, prep.status)
        detail = (f"{prep.rows} rows, {prep.tokens:,} tokens (counts: cache {counts.cache})"
                  + (f"; {prep.reason}" if prep.status == "rebuilt" else "")
                  + (f"; {prep.tokens / prep.build_s / 1e6:.2f}M tokens/s" if prep.build_s else ""))
        result = {"key": prep.key, "path": str(prep.path), "rows": prep.rows, "tokens": prep.tokens}
        write_stamp(root, ident, inputs, [prep.path / DATA_FILE, prep.path / META_FILE,
                                          counts_file(work.data_dir / TOKEN_CACHE_DIR, counts.key) or prep.path],
                    result)
        items.append(Item("training_data", label, status, dt, detail,
                          {**result, "token_counts_cache": counts.cache, "stamp": why}))
        echo(f"data     {status:<9} {label}  ({detail}, {dt:.1f} s)")
    return items


def _prepare_vision(ti: TrainInput, model_dir: Path, data_dir: Path, label: str, t0: float,
                    echo: Callable[[str], None]) -> Item:
    """A vision dataset prepared where the jobs of sbench's trainer read it (:mod:`harness.data.visionprep`: the
    entries with their text rendered, memory-mapped) and its exact token counts (text and image tokens per
    entry, through the model's processor): each job then renders and counts nothing."""
    root = data_dir / PREP_DIR
    image_field = ti.image_field or IMAGE_FIELD
    ident = {"kind": "vision", "model": ti.model, "model_dir": str(model_dir), "dataset": ti.dataset_path,
             "text_field": ti.text_field, "image_field": image_field}
    inputs = [Path(ti.dataset_path), model_dir]
    stamped, why = read_stamp(root, ident, inputs)
    if stamped is not None:
        dt = time.monotonic() - t0
        detail = (f"{stamped['rows']} entries, {stamped['tokens']:,} tokens of which {stamped['image_tokens']:,} "
                  "image tokens; inputs unchanged since the last check")
        echo(f"data     ready     {label}  ({detail}, {dt:.1f} s)")
        return Item("training_data", label, "ready", dt, detail, {**stamped, "token_counts_cache": "hit",
                                                                  "stamp": "hit"})
    processor = load_processor(str(model_dir))
    cache = data_dir / TOKEN_CACHE_DIR
    prep = ensure_vision_prepared(processor, ti.dataset_path, text_field=ti.text_field, image_field=image_field,
                                  root=root, token_cache=cache, open_dataset=False)
    counts = vision_token_counts(processor, ti.dataset_path, text_field=ti.text_field, image_field=image_field,
                                 cache_dir=cache, dataset_sha=prep.doc["dataset_sha256"])
    s = counts.summary()
    dt = time.monotonic() - t0
    status = {"hit": "ready"}.get(prep.status, prep.status)
    detail = (f"{s['entries']} entries, {s['total']:,} tokens of which {s['image_tokens']:,} image tokens "
              f"(counts: cache {counts.cache})" + (f"; {prep.reason}" if prep.status == "rebuilt" else ""))
    result = {"key": prep.key, "path": str(prep.path), "rows": s["entries"], "tokens": s["total"],
              "image_tokens": s["image_tokens"]}
    write_stamp(root, ident, inputs, [prep.path / DATA_FILE, prep.path / META_FILE,
                                      vision_counts_file(cache, counts.key) or prep.path], result)
    echo(f"data     {status:<9} {label}  ({detail}, {dt:.1f} s)")
    return Item("training_data", label, status, dt, detail,
                {**result, "token_counts_cache": counts.cache, "stamp": why})


@dataclass
class PrepareReport:
    """What ``sbench prepare`` did: its items, and why there was nothing to do when there was not."""

    items: list[Item]
    nothing: str | None = None  # why nothing needed preparing (no valid training point)

    @property
    def unusable(self) -> list[Item]:
        """Items a valid point needs that could not be made usable here."""
        return [i for i in self.items if i.status == "not_visible"]

    def problem(self) -> str | None:
        """One sentence on what is not usable and why; None when everything is."""
        bad = self.unusable
        if not bad:
            return None
        models = sorted({i.name for i in bad if i.kind == "model"})
        data = sum(1 for i in bad if i.kind == "training_data")
        what = f"{data} training input(s) could not be tokenized here" if data else f"{len(bad)} item(s) are not usable"
        return (f"{what}: the model {', '.join(models) or '(unknown)'} is not visible from this machine, so the jobs "
                "would tokenize at start-up")

    def to_dict(self) -> dict[str, Any]:
        return {"items": [i.to_dict() for i in self.items], "nothing": self.nothing, "problem": self.problem()}


def nothing_to_prepare(sweep: Any, points: list[Any]) -> str | None:
    """Why a sweep's jobs read nothing to prepare, or None when they do."""
    if sweep.runner.workload != "train":
        return f"runner.workload is {sweep.runner.workload}, so its jobs read no model and no data"
    if not any(p.valid for p in points):
        return "the sweep has no valid point (sbench plan says why)"
    return None


def prepare_sweep(sweep_path: Path, inventory_path: Path | None = None, model_map: Path | None = None,
                  echo: Callable[[str], None] = lambda s: None) -> PrepareReport:
    """Load, plan and prepare a sweep here (the login node, or inside the --on slurm job)."""
    inv = load_inventory(inventory_path)
    sweep = load_sweep(sweep_path, model_map)
    points = plan_sweep(sweep, inv)
    nothing = nothing_to_prepare(sweep, points)
    return PrepareReport(run_prepare(work_for(sweep, inv, points), echo) if nothing is None else [], nothing)


# -- --on slurm ----------------------------------------------------------------------------------------------
def prepare_script(sweep: Any, inv: Any, sweep_path: Path, inventory_path: Path | None, model_map: Path | None,
                   out_dir: Path) -> str:
    """The sbatch script of the preparation job: this command, run from here, on one node of the sweep's
    partition with the partition's Python (else the inventory's, else this one)."""
    part = inv.partition(sweep.partition)
    python = part.python or inv.python or sys.executable
    argv = [python, "-m", "harness", "prepare", str(sweep_path.resolve())]
    if inventory_path is not None:
        argv += ["-i", str(Path(inventory_path).resolve())]
    if model_map is not None:
        argv += ["--model-map", str(Path(model_map).resolve())]
    return prepare_sbatch(sweep, inv, argv, os.getcwd(), out_dir)


def submit_prepare_job(sweep: Any, inv: Any, sweep_path: Path, inventory_path: Path | None, model_map: Path | None,
                       campaign_dir: Path, slurm: Slurm | None = None) -> str:
    """Submit the preparation job; returns its SLURM job id."""
    camp = CampaignPaths(campaign_dir)
    camp.slurm.mkdir(parents=True, exist_ok=True)
    script = prepare_script(sweep, inv, sweep_path, inventory_path, model_map, camp.slurm)
    return (slurm or Slurm()).sbatch(script, camp.submissions)


def record_prepare_job(campaign_dir: Path, job_id: str) -> None:
    campaign_dir.mkdir(parents=True, exist_ok=True)
    CampaignPaths(campaign_dir).prepare_job.write_text(
        json.dumps({"job_id": job_id, "submitted_at": now_iso()}) + "\n")


def live_prepare_job(campaign_dir: Path, slurm: Slurm) -> str | None:
    """The campaign's recorded preparation job when SLURM still has it queued or running."""
    try:
        job_id = str(safefile.read_json(CampaignPaths(campaign_dir).prepare_job, campaign_dir,
                                        safefile.SMALL_MAX)["job_id"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    state = slurm.states([job_id]).get(job_id)
    return job_id if state is not None and not jobstate.is_done(state) else None


def failed_prepare_jobs(workdir: Path, campaign: str | None, slurm: Slurm) -> list[str]:
    """A line for each campaign whose ``--prepare-on slurm`` job did not complete (its arrays were cancelled)."""
    records = []
    for camp in CampaignPaths.listed(workdir, campaign):
        try:
            safefile.check_dir(camp.root, workdir)
            records.append((camp, str(safefile.read_json(camp.prepare_job, camp.root, safefile.SMALL_MAX)["job_id"])))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    if not records:
        return []
    states = slurm.states([job for _, job in records])
    out = []
    for camp, job in records:
        st = states.get(job)
        if st and jobstate.is_done(st) and jobstate.normalise(st) != "COMPLETED":
            log = camp.prepare_log(job)
            out.append(f"campaign {camp.name}: prepare job {job} ended {jobstate.normalise(st)}, so its arrays were "
                       f"cancelled; see {log}, fix it, then sbench retry {camp.name}")
    return out
