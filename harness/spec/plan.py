"""Sweeps and plans: expand a sweep into points, resolve defaults, apply the validity rules.

A *point* is an experiment plus its fully resolved entity values; its id is a
stable hash of exactly those, so the same point is recognised across
campaigns. Invalid points are reported with their reasons, never dropped.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.contract import envvars
from harness.contract.defaults import RunnerSettings
from harness.contract.errors import CatalogError, InputError, SweepError

from .catalog import (
    EXPERIMENTS,
    OPTIMIZER_NEEDS,
    OPTIMIZERS_GONE,
    VISION_DATASETS,
    Experiment,
    ModelMap,
    get_experiment,
    is_local_source,
    load_model_map,
    model_config,
    mount_visible,
    num_local_experts,
)
from .envs import (
    CPU_FSDP_ACCELERATE,
    FAST_MOE_SINCE,
    FEATURE_PLUGINS,
    env_has,
    env_version,
    envs_root,
    features_of,
    lookup,
    release_of,
)
from .inventory import Inventory, Partition, shared_dir
from .memory import predict
from .references import parse_references
from .resources import cpus_per_task
from .schema import (
    MAX_LIST,
    NAME,
    SLURM_CONSTRAINT,
    SLURM_CONSTRAINT_TEXT,
    SLURM_NAME,
    SLURM_NAME_TEXT,
    SLURM_TIME,
    SLURM_TIME_TEXT,
    Checker,
    sbatch_extra,
)
from .yamlio import LineDict, load_yaml

SWEEP_KEYS = ("campaign", "experiment", "partition", "description", "entity", "grid", "repeats", "slurm",
              "model_map", "data_dir", "runner", "references")
SLURM_KEYS = ("time", "account", "qos", "constraint", "exclusive", "mem_gb", "max_parallel", "requeue", "extra")
RUNNER_KEYS = ("sample_interval_s", "auto_stop", "stop_grace_s", "token_cache", "workload", "idle_seconds",
               "memory_every_steps")
WORKLOADS = ("train", "idle")
AUTO_STOP_KEYS = ("warmup_seconds", "stable_seconds", "min_steps")
CAMPAIGN_NAME = NAME  # fullmatch only: '$' would accept a trailing newline
MAX_REPEATS = 1000
MAX_RUNS = 100_000  # points x repeats of one sweep; a larger grid is a typo, or several campaigns
MAX_PARALLEL = 100_000


@dataclass(frozen=True)
class SlurmOverrides:
    time: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    exclusive: bool | None = None
    mem_gb: float | None = None
    max_parallel: int | None = None
    requeue: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Sweep:
    campaign: str
    experiment: Experiment
    source: str
    base_dir: Path
    partition: str | None
    entity: dict[str, Any]
    grid: dict[str, list[Any]]
    repeats: int
    slurm: SlurmOverrides
    model_map: ModelMap
    data_dir: Path
    runner: RunnerSettings
    description: str = ""
    data_dir_set: bool = False  # the sweep names its data_dir (else the inventory's defaults.data_dir may)
    references: list[Any] = field(default_factory=list)  # harness.references.Reference, in file order
    lines: dict[str, int] = field(default_factory=dict)


def data_dir_for(sweep: Sweep, inv: Any) -> Path:
    """Where the jobs read datasets and prepared data: the sweep's data_dir, else the inventory's
    defaults.data_dir, else $SBENCH_DATA_DIR / the built-in default."""
    if sweep.data_dir_set:
        return sweep.data_dir
    return shared_dir(inv.data_dir, inv) or sweep.data_dir


@dataclass
class PlannedPoint:
    point_id: str
    repeat: int
    experiment: str
    entity: dict[str, Any]
    valid: bool
    reasons: list[str]
    notes: list[str]
    partition: str
    model_source: str | None
    memory: dict[str, Any] | None = None  # harness.memory's prediction (plan --memory)

    @property
    def predicted_oom(self) -> bool:
        return bool(self.memory and self.memory.get("predicted_oom"))

    def to_dict(self) -> dict[str, Any]:
        out = {
            "point_id": self.point_id, "repeat": self.repeat, "experiment": self.experiment,
            "entity": self.entity, "valid": self.valid, "reasons": self.reasons, "notes": self.notes,
            "partition": self.partition, "model_source": self.model_source,
        }
        if self.memory is not None:
            out["memory"] = self.memory
            out["predicted_oom"] = self.predicted_oom
        return out


def point_id(experiment: str, entity: Mapping[str, Any], workload: str = "train") -> str:
    """Stable id: a hash of the experiment and every resolved entity value (key order irrelevant). A dry
    run (``runner.workload: idle``) has ids of its own, so it never stands for a trained point."""
    exp = EXPERIMENTS.get(experiment)
    ent = dict(entity)
    if exp is not None:
        for f in exp.fields:
            if f.id_omit_default and f.name in ent and ent[f.name] == f.default:
                del ent[f.name]
    doc: dict[str, Any] = {"experiment": experiment, "entity": ent}
    if workload != "train":
        doc["workload"] = workload
    blob = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def load_sweep(path: str | Path, model_map_path: str | Path | None = None) -> Sweep:
    p = Path(path)
    doc = load_yaml(p, SweepError, "sweep")
    return parse_sweep(doc, str(p), p.parent.resolve(), model_map_path)


def parse_sweep(doc: Any, source: str, base_dir: Path, model_map_path: str | Path | None = None) -> Sweep:
    ck = Checker(source, SweepError)
    if doc is None:
        ck.fail("(document)", "is empty; expected campaign:, experiment: and entity:")
    doc = ck.mapping(doc, "(document)")
    ck.known_keys(doc, "", SWEEP_KEYS)
    campaign = ck.require(doc, "", "campaign", "a unique name for this sweep's results")
    campaign = ck.string(doc, "", "campaign")
    if not CAMPAIGN_NAME.fullmatch(campaign):
        ck.fail("campaign", f"must use letters, digits, '.', '_' or '-' (max 100), got {campaign!r}", doc, "campaign")
    ck.require(doc, "", "experiment", "e.g. finetune_lora_benchmark-v1.0.0; see 'sbench experiments list'")
    exp_id = ck.string(doc, "", "experiment")
    try:
        experiment = get_experiment(exp_id)
    except CatalogError as exc:
        ck.fail("experiment", str(exc).replace("unknown experiment", "names an unknown experiment"), doc, "experiment")
    entity = dict(ck.mapping(doc.get("entity"), "entity", doc, "entity"))
    grid_node = ck.mapping(doc.get("grid"), "grid", doc, "grid")
    grid: dict[str, list[Any]] = {}
    combos = 1
    for k, v in grid_node.items():
        values = v if isinstance(v, list) else [v]
        if not values:
            ck.fail(f"grid.{k}", "is an empty list; give at least one value", grid_node, k)
        if len(values) > MAX_LIST:
            ck.fail(f"grid.{k}", f"has {len(values)} values; at most {MAX_LIST} are allowed", grid_node, k)
        grid[str(k)] = values
        combos *= len(values)
    known = experiment.field_names
    for section, node in (("entity", entity), ("grid", grid)):
        for k in node:
            if k not in known:
                import difflib
                close = difflib.get_close_matches(k, known, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                ck.fail(f"{section}.{k}", f"is not a field of {experiment.id}; {hint}valid fields: {', '.join(known)}",
                        doc.get(section), k)
    both = sorted(set(entity) & set(grid))
    if both:
        ck.fail(f"grid.{both[0]}", "is set in both entity: and grid:; keep it in one place", grid_node, both[0])
    repeats = ck.integer(doc, "", "repeats", default=1, minimum=1, maximum=MAX_REPEATS)
    if combos * repeats > MAX_RUNS:
        ck.fail("grid", f"expands to {combos} grid combinations x {repeats} repeat(s) = {combos * repeats} runs; at "
                        f"most {MAX_RUNS} are allowed in one sweep - split it into several campaigns",
                doc, "grid" if "grid" in doc else "repeats")
    slurm_node = ck.mapping(doc.get("slurm"), "slurm", doc, "slurm")
    ck.known_keys(slurm_node, "slurm", SLURM_KEYS)
    slurm_name = {"pattern": SLURM_NAME, "what": SLURM_NAME_TEXT}
    slurm = SlurmOverrides(
        time=ck.string(slurm_node, "slurm", "time", pattern=SLURM_TIME, what=SLURM_TIME_TEXT),
        account=ck.string(slurm_node, "slurm", "account", **slurm_name),
        qos=ck.string(slurm_node, "slurm", "qos", **slurm_name),
        constraint=ck.string(slurm_node, "slurm", "constraint", pattern=SLURM_CONSTRAINT,
                             what=SLURM_CONSTRAINT_TEXT),
        exclusive=ck.boolean(slurm_node, "slurm", "exclusive"),
        mem_gb=ck.number(slurm_node, "slurm", "mem_gb", minimum=0, maximum=1 << 20),
        max_parallel=ck.integer(slurm_node, "slurm", "max_parallel", minimum=1, maximum=MAX_PARALLEL),
        requeue=ck.boolean(slurm_node, "slurm", "requeue", default=False),
        extra=sbatch_extra(ck, slurm_node, "slurm", "extra"),
    )
    runner_node = ck.mapping(doc.get("runner"), "runner", doc, "runner")
    ck.known_keys(runner_node, "runner", RUNNER_KEYS)
    auto = ck.mapping(runner_node.get("auto_stop"), "runner.auto_stop", runner_node, "auto_stop")
    ck.known_keys(auto, "runner.auto_stop", AUTO_STOP_KEYS)
    d = RunnerSettings()  # the defaults
    interval = ck.number(runner_node, "runner", "sample_interval_s", default=d.sample_interval_s, minimum=0.01,
                         maximum=3600)
    day = 86400.0
    runner = RunnerSettings(
        sample_interval_s=float(interval),
        warmup_seconds=float(ck.number(auto, "runner.auto_stop", "warmup_seconds", default=d.warmup_seconds,
                                       minimum=0, maximum=day)),
        stable_seconds=float(ck.number(auto, "runner.auto_stop", "stable_seconds", default=d.stable_seconds,
                                       minimum=0, maximum=day)),
        min_steps=ck.integer(auto, "runner.auto_stop", "min_steps", default=d.min_steps, minimum=1,
                             maximum=10**9),
        stop_grace_s=float(ck.number(runner_node, "runner", "stop_grace_s", default=d.stop_grace_s, minimum=0,
                                     maximum=day)),
        token_cache=ck.boolean(runner_node, "runner", "token_cache", default=d.token_cache),
        workload=ck.string(runner_node, "runner", "workload", default=d.workload),
        idle_seconds=float(ck.number(runner_node, "runner", "idle_seconds", default=d.idle_seconds, minimum=0,
                                     maximum=day)),
        memory_every_steps=ck.integer(runner_node, "runner", "memory_every_steps", default=d.memory_every_steps,
                                      minimum=1, maximum=10**9),
    )
    if runner.workload not in WORKLOADS:
        ck.fail("runner.workload", f"must be one of: {', '.join(WORKLOADS)}; got {runner.workload!r}", runner_node,
                "workload")
    try:
        mm = load_model_map(model_map_path)
        if doc.get("model_map") is not None:
            mm = mm.merged(ck.mapping(doc["model_map"], "model_map", doc, "model_map"), source, base_dir)
    except InputError as exc:
        raise SweepError(str(exc)) from None
    data_dir_raw = ck.string(doc, "", "data_dir", max_len=1024)
    if data_dir_raw:
        data_dir = Path(data_dir_raw).expanduser()
        if not data_dir.is_absolute():
            data_dir = (base_dir / data_dir).resolve()
    else:
        data_dir = Path(envvars.DATA_DIR.get()).resolve()
    partition = ck.string(doc, "", "partition")
    if partition is not None:
        ck.name(partition, "partition", doc, "partition", what="partition name")

    references = parse_references(doc.get("references"), experiment, ck, doc)
    return Sweep(
        references=references,
        campaign=campaign, experiment=experiment, source=source, base_dir=base_dir,
        partition=partition, entity=entity, grid=grid, repeats=repeats, slurm=slurm,
        model_map=mm, data_dir=data_dir, runner=runner, data_dir_set=bool(data_dir_raw),
        description=ck.string(doc, "", "description", default="", nonempty=False, multiline=True) or "",
        lines=dict(doc.lines) if isinstance(doc, LineDict) else {},
    )


def _where(sweep: Sweep, combo_keys: dict[str, int], name: str) -> str:
    if name in combo_keys:
        return f"{sweep.source}: grid.{name}[{combo_keys[name]}]"
    return f"{sweep.source}: entity.{name}"


def resolve_entity(sweep: Sweep, raw: Mapping[str, Any], partition: Partition,
                   combo_keys: dict[str, int]) -> tuple[dict[str, Any], list[str]]:
    """Fill defaults and hardcoded values, check types and domains. Returns (entity, notes)."""
    exp = sweep.experiment
    notes: list[str] = []
    values = dict(raw)
    if values.get("gpu_model") in (None, "") and "gpu_model" not in raw:
        values["gpu_model"] = partition.gpu_model
        notes.append(f"gpu_model taken from partition {partition.name!r}: {partition.gpu_model}")
    entity: dict[str, Any] = {}
    for spec in exp.fields:
        where = _where(sweep, combo_keys, spec.name)
        if spec.name in values:
            entity[spec.name] = spec.coerce(values[spec.name], where)
        elif spec.required:
            raise SweepError(f"{sweep.source}: entity.{spec.name} is required by {exp.id} but missing; "
                             f"add it under entity: or grid: ({spec.help})")
        else:
            entity[spec.name] = spec.default
    # Model names: the experiment's own list plus anything a model map names.
    name = entity["model_name"]
    if name not in exp.models and name not in sweep.model_map:
        raise SweepError(
            f"{_where(sweep, combo_keys, 'model_name')}: unknown model {name!r} for {exp.id}; add it to the "
            f"sweep's model_map: (name: HF id or local path) or use one of: {', '.join(exp.models)}")
    # Single-device runs use no distributed backend (the trainer runs directly).
    if "distributed_backend" in entity:
        if entity["number_gpus"] <= 1 and entity["distributed_backend"] == "DEEPSPEED":
            pass  # ZeRO-Offload on one device is a memory technique of its own: keep it
        elif entity["number_gpus"] <= 1:
            if entity["distributed_backend"] is not None:
                notes.append(f"distributed_backend {entity['distributed_backend']} ignored: single-device run")
            entity["distributed_backend"] = None
        elif entity["distributed_backend"] is None:
            entity["distributed_backend"] = "FSDP"
    return entity, notes


def validity_reasons(exp: Experiment, e: Mapping[str, Any], model_cfg: Mapping[str, Any] | None,
                     model_src: str | None) -> tuple[list[str], list[str]]:
    """The reference is_valid rules 1-7. Returns (reasons the point is invalid, notes)."""
    reasons: list[str] = []
    notes: list[str] = []
    gpus, nodes, bs = e["number_gpus"], e.get("number_nodes", 1), e["batch_size"]
    if gpus > 0 and bs % gpus != 0:
        reasons.append(f"rule 1: batch_size {bs} is not divisible by number_gpus {gpus}")
    if nodes > 0 and gpus % nodes != 0:
        reasons.append(f"rule 2: number_gpus {gpus} is not divisible by number_nodes {nodes}")
    if nodes <= 0:
        reasons.append(f"rule 3: number_nodes must be greater than 0, got {nodes}")
    if bs <= 0:
        reasons.append(f"rule 4: batch_size must be greater than 0, got {bs}")
    if gpus > 0 and not str(e.get("gpu_model") or "").strip():
        reasons.append("rule 5: gpu_model must be a non-empty string when number_gpus > 0")
    fast_moe = e.get("fast_moe") or 0
    if fast_moe:
        if gpus % fast_moe != 0:
            reasons.append(f"rule 6: number_gpus {gpus} is not divisible by fast_moe {fast_moe}")
        if model_cfg is None:
            notes.append(f"rule 7 could not be checked: no local config.json for {model_src or e['model_name']} "
                         "(download the model or point model_map at a local copy)")
        else:
            experts = num_local_experts(model_cfg)
            if experts is None:
                reasons.append(f"rule 7: fast_moe {fast_moe} is set but model {e['model_name']} has no "
                               "num_local_experts (not a Mixture-of-Experts model)")
            elif experts % fast_moe != 0:
                reasons.append(f"rule 7: num_local_experts {experts} of {e['model_name']} is not divisible by "
                               f"fast_moe {fast_moe}")
    return reasons, notes


def _optimizer_reasons(e: Mapping[str, Any], part: Partition, notes: list[str]) -> list[str]:
    """An optimizer the trainer cannot build on this partition is an invalid point, not a failed run."""
    optim = str(e.get("optim") or "adamw_torch")
    if optim in OPTIMIZERS_GONE:
        return [f"placement: optim {optim} is not an optimizer of transformers 5 (the sbench trainer's); use "
                f"{OPTIMIZERS_GONE[optim]}"]
    need = OPTIMIZER_NEEDS.get(optim)
    if need is None:
        return []
    package, cuda = need
    if cuda and part.is_cpu:
        return [f"placement: optim {optim} runs on CUDA kernels of {package}; partition {part.name!r} is a CPU "
                "partition"]
    if optim in ("adamw_torch_xla", "adamw_torch_npu_fused"):
        return [f"placement: optim {optim} needs {'TPU/XLA' if 'xla' in optim else 'Ascend NPU'} devices; "
                f"partition {part.name!r} has {part.gpu_model}"]
    return _package_reason(package, f"optim {optim}", part, notes, f"pip install {package}, or choose adamw_torch")


def _package_reason(package: str, what: str, part: Partition, notes: list[str], install: str) -> list[str]:
    """*what* needs *package* where the jobs run: checked here when the jobs use this environment, a
    note when the partition names its own python."""
    import importlib.util

    if importlib.util.find_spec(package) is not None:
        return []
    if part.python is None:
        return [f"placement: {what} needs the {package} package, which this environment (the one the jobs run "
                f"in) lacks; {install}"]
    notes.append(f"{what} needs {package} in the nodes' python ({part.python}); not checked here")
    return []


def _deepspeed_reasons(e: Mapping[str, Any], part: Partition, notes: list[str]) -> list[str]:
    """DeepSpeed ZeRO: runs on GPUs and, through deepspeed's CPU accelerator over gloo, on CPU partitions."""
    ds = e.get("distributed_backend") == "DEEPSPEED"
    stage = int(e.get("deepspeed_zero_stage") or 2)
    if not ds:
        set_ = [k for k in ("deepspeed_offload_optimizer", "deepspeed_offload_params") if e.get(k)]
        if stage != 2:
            set_.insert(0, "deepspeed_zero_stage")
        return [f"placement: {', '.join(set_)} only apply to distributed_backend DEEPSPEED (this point uses "
                f"{e.get('distributed_backend') or 'no distributed backend'})"] if set_ else []
    reasons = []
    if e.get("deepspeed_offload_params") and stage != 3:
        reasons.append(f"placement: deepspeed_offload_params needs deepspeed_zero_stage 3 (got {stage}): only "
                       "ZeRO-3 partitions the parameters it could offload")
    mixed = str(e.get("accelerate_config_mixed_precision") or "no")
    if not part.is_cpu and mixed == "fp8":
        reasons.append("placement: accelerate_config_mixed_precision fp8 is not rendered for DEEPSPEED; use bf16")
    if not part.is_cpu and mixed == "fp16" and e.get("bf16"):
        reasons.append("placement: accelerate_config_mixed_precision fp16 contradicts bf16: true in the DeepSpeed "
                       "config; use bf16 for both")
    return reasons + _package_reason("deepspeed", "distributed_backend DEEPSPEED", part, notes,
                                     "pip install --no-build-isolation deepspeed (its build imports torch)")


def _qlora_reasons(exp: Experiment, e: Mapping[str, Any], part: Partition, notes: list[str]) -> list[str]:
    if not e.get("use_qlora"):
        return []
    if exp.method != "lora":
        return [f"placement: use_qlora quantises the frozen base of a LoRA run; {exp.id} is {exp.method}"]
    if part.is_cpu:
        return [f"placement: use_qlora loads 4-bit NF4 weights with bitsandbytes' CUDA kernels; partition "
                f"{part.name!r} is a CPU partition"]
    reasons = []
    if e.get("distributed_backend") == "DEEPSPEED" and int(e.get("deepspeed_zero_stage") or 2) == 3:
        reasons.append("placement: use_qlora with deepspeed_zero_stage 3 is not supported (ZeRO-3 cannot "
                       "partition 4-bit weights here); use stage 1 or 2, or FSDP")
    return reasons + _package_reason("bitsandbytes", "use_qlora", part, notes, "pip install bitsandbytes")


_FEATURE_TEXT = {"gptq-lora": "GPTQ-LoRA (--auto_gptq triton_v2, --fused_lora, --fast_kernels)",
                 "fast_kernels": "fast_kernels (fused loss, RMS norm and RoPE kernels)",
                 "fast_moe": "fast_moe (ScatterMoE expert parallelism)"}


def trainer_reasons(exp: Experiment, e: Mapping[str, Any], part: Partition, inv: Any,
                    notes: list[str]) -> list[str]:
    """Which trainer runs the point, and whether it can: fms-acceleration features exist only in the
    fms-hf-tuning trainer, on CUDA, with the plugin in that release's environment (harness.trainerenv)."""
    trainer = str(e.get("trainer") or "sbench")
    version = str(e.get("fms_hf_tuning_version"))
    reasons: list[str] = []
    if e.get("dataset_id") in VISION_DATASETS:
        reasons.append(f"dataset: {e['dataset_id']} is a vision dataset; it needs a vision-language model and its "
                       "processor, and neither sbench trainer feeds images (the sbench trainer trains text; the "
                       "fms-hf-tuning trainer is given the reference's text command line); use a text dataset")
    feats = features_of(exp.method, dict(e))
    for f in feats:
        if trainer != "fms-hf-tuning":
            reasons.append(f"trainer: {_FEATURE_TEXT[f]} needs fms-acceleration's plugins, which only the "
                           "fms-hf-tuning trainer loads; set trainer: fms-hf-tuning")
        elif part.is_cpu and f != "gptq-lora":  # gptq-lora: the experiment's own CUDA rule says so already
            reasons.append(f"placement: {_FEATURE_TEXT[f]} runs triton/CUDA kernels; partition {part.name!r} is a "
                           "CPU partition")
    if trainer != "fms-hf-tuning":
        if version != str(next((f.default for f in exp.fields if f.name == "fms_hf_tuning_version"), version)):
            notes.append(f"fms_hf_tuning_version {version} is recorded only: the sbench trainer runs this point")
        return reasons
    if "fast_moe" in feats and release_of(version) < FAST_MOE_SINCE:
        reasons.append(f"trainer: fast_moe needs fms-hf-tuning 2.4.0 or later; this point asks for {version}")
    root = envs_root(inv)
    env = lookup(version, root)
    if e.get("distributed_backend") == "DEEPSPEED" and not env_has(env, "deepspeed"):
        reasons.append(f"trainer: distributed_backend DEEPSPEED needs deepspeed in the fms-hf-tuning=={version} "
                       "environment, which the release does not install; use FSDP or DDP (or install deepspeed into "
                       f"{env.path} and run sbench env build fms-hf-tuning=={version} --refresh)")
    accelerate = env_version(env, "accelerate")
    if (part.is_cpu and e.get("distributed_backend") == "FSDP" and max(1, e["number_gpus"]) > 1 and accelerate
            and release_of(accelerate) < CPU_FSDP_ACCELERATE):
        reasons.append(f"trainer: FSDP on a CPU partition needs FSDP v2 (accelerate 1.6 or later); the "
                       f"fms-hf-tuning=={version} environment has accelerate {accelerate}; use DDP")
    if e.get("use_qlora"):
        reasons.append("trainer: use_qlora is the sbench trainer's (bitsandbytes NF4); with fms-hf-tuning use "
                       "the GPTQ-LoRA experiment")
    extras = ("fms-accel",) if feats else ()
    failed = env.failed_reason(extras)
    if failed:
        reasons.append(f"trainer: fms-hf-tuning=={version}{'[fms-accel]' if extras else ''} could not be installed "
                       f"in {env.path}: {failed}; fix it, then run sbench env build fms-hf-tuning=={version}"
                       f"{' --extras fms-accel' if extras else ''} (--requirements FILE installs pins the release "
                       "lacks)")
    elif not env.built:
        notes.append(f"trainer environment fms-hf-tuning=={version} is not built yet in {root}: sbench prepare "
                     f"builds it (or sbench env build fms-hf-tuning=={version}"
                     f"{' --extras fms-accel' if extras else ''})")
    else:
        missing = sorted({p for f in feats for p in FEATURE_PLUGINS[f]} - set(env.plugins()))
        if missing:
            notes.append(f"the fms-hf-tuning=={version} environment lacks {', '.join(missing)}: sbench prepare adds "
                         f"them (or sbench env build fms-hf-tuning=={version} --extras fms-accel)")
    if exp.method == "pt":
        notes.append("fms-hf-tuning runs the reference's prompt-tuning command line as written, --peft_method none "
                     "(so it tunes every weight); the sbench trainer runs --peft_method pt")
    return reasons


def placement_reasons(exp: Experiment, e: Mapping[str, Any], part: Partition) -> tuple[list[str], list[str]]:
    """Can the partition host this point? Returns (reasons, notes)."""
    reasons: list[str] = []
    notes: list[str] = []
    gpus, nodes = e["number_gpus"], e.get("number_nodes", 1)
    if nodes < 1:
        return reasons, notes
    if exp.requires_cuda and part.is_cpu:
        reasons.append(f"placement: {exp.method} needs CUDA GPUs; partition {part.name!r} is a CPU partition")
    if not part.is_cpu and gpus > 0 and e.get("gpu_model") and e["gpu_model"] != part.gpu_model:
        reasons.append(f"placement: point asks for gpu_model {e['gpu_model']!r}; partition {part.name!r} has "
                       f"{part.gpu_model!r}")
    if not exp.multi_node and nodes > 1:
        reasons.append(f"placement: {exp.id} runs on a single node; number_nodes is {nodes}")
    if nodes > len(part.hosts):
        reasons.append(f"placement: number_nodes {nodes} exceeds the {len(part.hosts)} host(s) of partition "
                       f"{part.name!r}")
    per_node = gpus // nodes if nodes and gpus % nodes == 0 else -(-gpus // max(nodes, 1))
    if per_node > part.gpus_per_node:
        unit = "worker processes" if part.is_cpu else "GPUs"
        reasons.append(f"placement: {per_node} {unit} per node requested; partition {part.name!r} has "
                       f"{part.gpus_per_node} per node")
    cpus = cpus_per_task(part, per_node)
    if cpus > part.cpus_per_node:
        reasons.append(f"placement: needs {cpus} CPUs per node (at least 2); partition "
                       f"{part.name!r} has {part.cpus_per_node}")
    elif part.is_cpu and cpus < per_node:
        reasons.append(f"placement: {per_node} worker processes per node get {cpus} cores; partition "
                       f"{part.name!r} needs at least one core per worker")
    reasons += _optimizer_reasons(e, part, notes)
    if e.get("fsdp_offload_params"):
        if part.is_cpu:
            reasons.append(f"placement: fsdp_offload_params moves GPU memory to the host; partition {part.name!r} is "
                           "a CPU partition")
        elif e.get("distributed_backend") != "FSDP" or max(1, gpus) < 2:
            reasons.append("placement: fsdp_offload_params needs distributed_backend FSDP over 2 or more GPUs")
    reasons += _deepspeed_reasons(e, part, notes)
    reasons += _qlora_reasons(exp, e, part, notes)
    if e.get("enable_roce") and nodes > 1:
        missing = [h.name for h in part.hosts.values() if h.roce is None]
        if missing:
            reasons.append(f"placement: enable_roce needs roce settings on every host of partition {part.name!r}; "
                           f"missing on {', '.join(missing)}")
    elif e.get("enable_roce"):
        notes.append("enable_roce has no effect on a single-node run")
    if part.is_cpu and e.get("distributed_backend") == "FSDP" and e.get("fsdp_sharding_strategy") == "NO_SHARD":
        reasons.append("placement: fsdp_sharding_strategy NO_SHARD has no FSDP v2 equivalent (CPU partitions "
                       "use FSDP v2); use distributed_backend DDP")
    return reasons, notes


def _combos(sweep: Sweep) -> list[tuple[dict[str, Any], dict[str, int]]]:
    keys = list(sweep.grid)
    out = []
    for idx in itertools.product(*(range(len(sweep.grid[k])) for k in keys)):
        raw = dict(sweep.entity)
        pos = {}
        for k, i in zip(keys, idx):
            raw[k] = sweep.grid[k][i]
            pos[k] = i
        out.append((raw, pos))
    return out


def plan_sweep(sweep: Sweep, inventory: Inventory, *, memory: bool = False) -> list[PlannedPoint]:
    """Every point x repeat of the sweep, with validity and reasons; with *memory*, each valid point's
    predicted per-device memory (harness.memory)."""
    try:
        partition = inventory.partition(sweep.partition)
    except InputError as exc:
        raise SweepError(f"{sweep.source}: partition: {exc}") from None
    exp = sweep.experiment
    cfg_cache: dict[str, Any] = {}
    points: list[PlannedPoint] = []
    seen: set[str] = set()
    for raw, pos in _combos(sweep):
        entity, notes = resolve_entity(sweep, raw, partition, pos)
        variant = "GPTQ-Quantized" if exp.method == "gptq-lora" else "Vanilla"
        src = sweep.model_map.source(entity["model_name"], variant)
        unquantized = src is None and variant != "Vanilla"
        if unquantized:
            src = sweep.model_map.source(entity["model_name"])
        cfg = None
        if entity.get("fast_moe") and src:
            if src not in cfg_cache:
                cfg_cache[src] = model_config(src)
            cfg = cfg_cache[src]
        reasons, vnotes = validity_reasons(exp, entity, cfg, src)
        preasons, pnotes = placement_reasons(exp, entity, partition)
        preasons += trainer_reasons(exp, entity, partition, inventory, pnotes)
        if unquantized:
            # fms-acceleration's GPTQ loader reads the checkpoint's quantization config: plain weights fail.
            preasons.append(f"model: GPTQ-LoRA needs GPTQ-quantized weights and none are mapped for "
                            f"{entity['model_name']}; add model_map.{entity['model_name']}.GPTQ-Quantized")
        elif exp.method == "gptq-lora" and src and is_local_source(src) and Path(src).expanduser().exists():
            if src not in cfg_cache:
                cfg_cache[src] = model_config(src)
            quant = ((cfg_cache[src] or {}).get("quantization_config") or {}).get("quant_method")
            if quant != "gptq":
                found = f"quantization {quant!r}" if quant else "no quantization_config"
                preasons.append(f"model: GPTQ-LoRA needs GPTQ-quantized weights; {src} has {found} in config.json")
        if src is None:
            preasons.append(f"model: no weights mapped for {entity['model_name']}; add it to model_map:")
        elif is_local_source(src) and not Path(src).expanduser().exists():
            origin = sweep.model_map.origins.get(entity["model_name"], "built-in")
            if origin != "built-in" and mount_visible(src):
                # A path the user wrote: a typo here costs an allocation, so it is an input error.
                raise SweepError(
                    f"{origin}: model_map.{entity['model_name']} points to {src}, which does not exist; fix the "
                    f"path, or create it (for a test model: sbench model tiny -o {src})")
            # The built-in map names the reference deployment's paths, and a file system that is not
            # mounted here at all may be mounted on the compute nodes: say so, do not invalidate.
            notes.append(f"model weights {src} are not visible from this machine (for a test model: "
                         f"sbench model tiny -o {src})")
        pid = point_id(exp.id, entity, sweep.runner.workload)
        if pid in seen:
            # The same point reached twice through the grid (e.g. a backend ignored on one device).
            grid_pos = ", ".join(f"{k}[{i}]" for k, i in pos.items())
            for p in points:
                if p.point_id == pid:
                    p.notes.append(f"also produced by grid combination {grid_pos}; measured once")
            continue
        seen.add(pid)
        mem = None
        if memory and not (reasons or preasons):
            if src and src not in cfg_cache:
                cfg_cache[src] = model_config(src)
            mem = predict(entity, exp.method, cfg_cache.get(src) if src else None, partition,
                          target_modules=tuple(exp.target_modules(entity["model_name"], sweep.model_map))
                          if exp.method in ("lora", "gptq-lora") else ()).to_dict()
        for r in range(sweep.repeats):
            points.append(PlannedPoint(
                point_id=pid, repeat=r, experiment=exp.id, entity=entity, valid=not (reasons or preasons),
                reasons=reasons + preasons, notes=notes + vnotes + pnotes, partition=partition.name,
                model_source=src, memory=mem,
            ))
    return points
