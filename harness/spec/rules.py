"""The validity rules: whether a point can run at all (the reference's ``is_valid`` rules), whether this
partition can host it, and whether its trainer can run it. Each returns reasons (the point is invalid)
and adds notes (it runs, but the user should know)."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

from .catalog import OPTIMIZER_NEEDS, OPTIMIZERS_GONE, VISION_ID_RE, Experiment, dtype_name, is_vision_dataset
from .envs import (
    CPU_FSDP_ACCELERATE,
    FAST_MOE_SINCE,
    FEATURE_PLUGINS,
    VISION_RELEASE,
    VISION_SINCE,
    env_has,
    env_name,
    env_version,
    envs_root,
    features_of,
    lookup,
    release_of,
)
from .inventory import Partition
from .modelconfig import is_vision_config, num_local_experts
from .resources import cpus_per_task, point_counts


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


VISION_MODELS_HINT = "granite-vision-3.2-2b, llava-v1.6-mistral-7b, or a local LLaVA-NeXT model"


def vision_release(e: dict[str, Any], named: bool, arch: Mapping[str, Any] | None, notes: list[str]) -> None:
    """An fms-hf-tuning point on a vision dataset with a vision-language model that names no release (*named*
    false) runs :data:`VISION_RELEASE`, not the seed's default, which cannot tune it; a release the sweep
    names is kept (and judged by :func:`vision_reasons`)."""
    if (named or str(e.get("trainer") or "sbench") != "fms-hf-tuning" or arch is None or not is_vision_config(arch)
            or not is_vision_dataset(e.get("dataset_id"))):
        return
    version = str(e.get("fms_hf_tuning_version"))
    if release_of(version) < VISION_SINCE:
        e["fms_hf_tuning_version"] = VISION_RELEASE
        notes.append(f"fms_hf_tuning_version {VISION_RELEASE}: the default release ({version}) does not tune "
                     "vision-language models (from 2.8.0); name a release in the sweep to choose another")


def vision_reasons(exp: Experiment, e: Mapping[str, Any], arch: Mapping[str, Any] | None, arch_source: str | None,
                   notes: list[str]) -> list[str]:
    """Image + text points: a vision dataset needs a vision-language model (and a vision-language model a
    vision dataset), told from the model's config.json or the catalogue's facts (*arch*, from *arch_source*);
    prompt tuning only where the trainer runs it."""
    vision_data = is_vision_dataset(e.get("dataset_id"))
    name = e["model_name"]
    if arch is None:
        if vision_data:
            notes.append(f"{name} has no config.json here and is not in sbench's catalogue, so whether it is a "
                         "vision-language model is not checked before it runs (a text model fails at setup)")
        return []
    vision_model = is_vision_config(arch)
    kind = f"model_type {arch.get('model_type') or '?'}, from {arch_source}"
    trainer = str(e.get("trainer") or "sbench")
    if vision_data and not vision_model:
        return [f"dataset: {e['dataset_id']} is a vision (image + text) dataset and {name} is a text model ({kind}); "
                f"use a vision-language model ({VISION_MODELS_HINT}) or a text dataset"]
    if vision_model and not vision_data:
        return [f"dataset: {name} is a vision-language model ({kind}) and {e.get('dataset_id')} is a text dataset; "
                "both trainers feed it images through its processor (fms-hf-tuning's vision collator needs "
                "--dataset_image_field); use a vision dataset (vision-384x384-16384plus-entries-4096, "
                "vision-384x768-16384plus-entries-4096)"]
    if not vision_model:
        return []
    version = str(e.get("fms_hf_tuning_version"))
    if trainer == "fms-hf-tuning" and release_of(version) < VISION_SINCE:
        return [f"trainer: fms-hf-tuning tunes vision-language models (--dataset_image_field) from 2.8.0; this point "
                f"asks for {version}; set fms_hf_tuning_version: 3.2.2 (or another release from 2.8.0)"]
    if exp.method == "pt" and trainer == "sbench":
        return ["trainer: prompt tuning of a vision-language model is not run by the sbench trainer (PEFT's "
                "virtual tokens shift the image-token positions the model merges its image features into); set "
                "trainer: fms-hf-tuning, which runs the seed's prompt-tuning line as written (--peft_method none)"]
    if exp.method == "lora":
        if trainer == "sbench":
            notes.append(f"LoRA on {name} targets {', '.join(exp.target_modules(name))} of the language model only; "
                         "the vision tower and the projector stay frozen")
        else:
            notes.append("fms-hf-tuning applies --target_modules to every module of that name, the vision "
                         "tower's included where it has them (as the seed's command line does); the projector "
                         "stays frozen")
    return []


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
    if (part.is_cpu and e.get("distributed_backend") == "FSDP" and not point_counts(e).single and accelerate
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
    per_node = point_counts(e).devices_per_node
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
        elif e.get("distributed_backend") != "FSDP" or point_counts(e).single:
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


def change_warnings(exp: Experiment, e: Mapping[str, Any], part: Partition, inv: Any) -> list[str]:
    """Settings the trainer will run otherwise than the point asks, as far as they are known before anything
    runs: without CUDA (a CPU partition) float32 weights, no mixed precision and no flash-attention; on GPUs,
    sdpa attention where the trainer's environment has no flash-attn. Each text names one cause, so that plan
    says it once however many points share it. Says nothing where it cannot know (another python, an
    environment not built yet)."""
    out = fms_vision_startup(e)
    return out + _runs_otherwise(exp, e, part, inv)


# fms-hf-tuning 3.2.2 on a 2-core machine, vision-384x384-16384plus-entries-4096: the dataset stage took 551 s
# and the tokens stage 95 s before the first of 3 steps (the release reads the Parquet file through datasets
# and renders every entry's chat template in the job; sbench prepare cannot do that for it)
FMS_VISION_STARTUP_S_PER_ENTRY = (551.0 + 95.0) / 4096


def fms_vision_startup(e: Mapping[str, Any]) -> list[str]:
    """What an fms-hf-tuning vision point costs before its first step, once per dataset."""
    m = VISION_ID_RE.fullmatch(str(e.get("dataset_id") or ""))
    if str(e.get("trainer") or "sbench") != "fms-hf-tuning" or m is None:
        return []
    entries = int(m[4])
    minutes = entries * FMS_VISION_STARTUP_S_PER_ENTRY / 60
    return [f"fms-hf-tuning reads {e['dataset_id']} through datasets and renders each of its {entries} entries' chat "
            f"template in the job, before the first step: expect about {minutes:.0f} minute(s) of start-up per job "
            f"on a 2-core node (measured: 646 s for 4096 entries; more cores shorten it), which sbench prepare "
            "does not save that trainer; trainer: sbench starts from the prepared entry in seconds"]


def _runs_otherwise(exp: Experiment, e: Mapping[str, Any], part: Partition, inv: Any) -> list[str]:
    asked = exp.asked_settings(e)
    flash = asked["attn_implementation"] == "flash_attention_2"
    if part.is_cpu:
        cpu = f"partition {part.name!r} has no GPUs"
        out = [f"{cpu}: points asking torch_dtype {asked['torch_dtype']} load float32 weights (measurements keep "
               "torch_dtype as asked; effective_torch_dtype records float32)"] \
            if dtype_name(asked["torch_dtype"]) != "float32" else []
        out += [f"{cpu}: {k} mixed precision is turned off" for k in ("bf16", "fp16") if asked[k]]
        return out + ([f"{cpu}: flash-attention runs as sdpa attention (measurements.attn_implementation)"]
                      if flash else [])
    if not flash:
        return []
    if str(e.get("trainer") or "sbench") == "fms-hf-tuning":
        version = str(e.get("fms_hf_tuning_version"))
        env = lookup(version, envs_root(inv))
        if not env.built or env_has(env, "flash-attn"):
            return []
        return [f"the {env_name(version)} environment has no flash-attn, so its points run sdpa attention instead "
                f"of flash-attention; for the reference's attention: {env.python} -m pip install flash-attn, then "
                f"sbench env build fms-hf-tuning=={version} --refresh"]
    if part.python or getattr(inv, "python", None) or importlib.util.find_spec("flash_attn") is not None:
        return []
    return [f"this python (the jobs' on partition {part.name!r}) has no flash_attn package, so the sbench trainer "
            "runs sdpa attention instead of flash-attention; for the reference's attention: pip install flash-attn"]
