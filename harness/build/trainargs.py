"""The training command line, built in one place.

:func:`train_argv` is the reference command line of the fms-hf-tuning experiments, argument for argument, plus
sbench's own measurement flags (:data:`OWN_FLAGS`); :func:`for_fms_hf_tuning` is what the fms-hf-tuning trainer
runs instead (the seed's line as written, with what the partition and the environment change, each recorded as
an adjustment). A job's ``launch.sh`` runs them (through :class:`harness.build.jobspec.JobSpec`), and a trainer
environment's build runs :func:`smoke_argv`, a LoRA job of the tiny model on a CPU partition made by the same
two functions.
"""

from __future__ import annotations

from typing import Any

from harness.contract.formats import IMAGE_FIELD, MESSAGES_FIELD, RESPONSE_TEMPLATE_ARG, TEXT_FIELD
from harness.spec.catalog import Experiment, get_experiment, is_vision_dataset

# sbench's own flags, each with one value: the sbench trainer reads them, the fms-hf-tuning trainer
# (harness.runner.fms) takes them out before the release parses its command line.
OWN_FLAGS = ("--job_dir", "--stop_after_seconds", "--auto_stop_method", "--distributed_backend",
             "--fsdp_use_orig_params")

# What a trainer environment's smoke run trains: the tiny model's LoRA targets, a short sequence.
SMOKE_EXPERIMENT = "finetune_lora_benchmark-v1.0.0"
SMOKE_TARGET_MODULES = ("q_proj", "v_proj")
SMOKE_SEQ_LEN = 64
SMOKE_BATCH = 2


def pack_in_one_process(trainer: Any, workload: Any, trials: Any) -> bool:
    """Whether the points of a pack (``slurm.pack``) of this trainer, workload and trials train in one training
    process, one after another: the sbench trainer, training once per point (the stability experiment's trials
    and fms-hf-tuning run one process per point). The node runner reads them from ``spec.json``, the
    submission from the :class:`~harness.build.jobspec.JobSpec`."""
    return (trainer or "sbench") == "sbench" and (workload or "train") == "train" and int(trials or 1) <= 1


def _bool(v: Any) -> str:
    return "True" if v else "False"


def train_argv(exp: Experiment, e: dict[str, Any], model_source: str, dataset_path: str, job_dir: str,
               per_device_bs: int, target_modules: tuple[str, ...]) -> list[str]:
    """The reference command line, argument for argument, plus sbench's own measurement flags."""
    hc = exp.hardcoded
    asked = exp.asked_settings(e)
    max_steps = hc.get("max_steps", e.get("max_steps", -1))
    reentrant = str(hc.get("gradient_checkpointing_use_reentrant",
                           e.get("gradient_checkpointing_use_reentrant", False))).lower()
    argv = [
        "--model_name_or_path", model_source,
        "--torch_dtype", asked["torch_dtype"],
        "--use_flash_attn", _bool(asked["attn_implementation"] == "flash_attention_2"),
        "--training_data_path", dataset_path,
        "--response_template", RESPONSE_TEMPLATE_ARG,
        "--dataset_text_field", e.get("dataset_text_field") or TEXT_FIELD,
        # A vision dataset: fms-hf-tuning's vision path (its processor and vision collator) needs the image
        # column and the chat messages' column (rendered with the processor's template into the text field),
        # and the columns the model's forward does not name (text, images) kept for that collator.
        *(["--dataset_image_field", e.get("dataset_image_field") or IMAGE_FIELD,
           "--dataset_conversation_field", MESSAGES_FIELD, "--remove_unused_columns", "False"]
          if is_vision_dataset(e.get("dataset_id")) else []),
        "--log_level", "debug",
        "--num_train_epochs", f"{float(e.get('num_train_epochs', 1.0)):g}",
        "--max_steps", str(max_steps),
        "--per_device_train_batch_size", str(per_device_bs),
        "--max_seq_length", str(e["model_max_length"]),
        "--eval_strategy", "no",
        "--output_dir", f"{job_dir}/output",
        "--gradient_accumulation_steps", str(e.get("gradient_accumulation_steps", 4)),
        "--save_strategy", "no",
        "--learning_rate", "1e-05",
        "--weight_decay", "0.0",
        "--warmup_ratio", "0.03",
        "--lr_scheduler_type", "cosine",
        "--logging_steps", "1",
        "--include_tokens_per_second", "True",
        "--gradient_checkpointing", _bool(hc.get("gradient_checkpointing", e.get("gradient_checkpointing", True))),
        "--packing", "False",
        "--peft_method", hc["peft_method"],
    ]
    if hc["peft_method"] == "lora":
        argv += ["--target_modules", *target_modules,
                 "--r", str(e.get("r", 4)), "--lora_alpha", str(e.get("lora_alpha", 16))]
    if hc["peft_method"] == "pt":
        argv += ["--num_virtual_tokens", str(hc["num_virtual_tokens"]),
                 "--prompt_tuning_init", hc["prompt_tuning_init"]]
    if exp.method == "gptq-lora":
        argv += ["--fp16", "true", "--fast_kernels", "true", "true", "true",
                 "--fused_lora", "auto_gptq", "true", "--auto_gptq", "triton_v2"]
    elif e.get("fast_kernels"):
        argv += ["--fast_kernels", *[str(x).lower() for x in e["fast_kernels"]]]
    argv += [
        "--optim", str(hc.get("optim", e.get("optim", "adamw_torch"))),
        *(["--optim_args", str(e["optim_args"])] if e.get("optim_args") else []),
        "--bf16", _bool(asked["bf16"]),
        "--gradient_checkpointing_kwargs",
        f'{{"use_reentrant": {reentrant}}}',
        "--fast_moe", str(e.get("fast_moe", 0)),
        "--distributed_backend", str(hc.get("distributed_backend", e.get("distributed_backend")) or "None"),
        "--fsdp_use_orig_params", _bool(e.get("fsdp_use_orig_params", True)),
        *(["--use_qlora", "True"] if e.get("use_qlora") else []),
        "--stop_after_seconds", f"{float(e.get('stop_after_seconds', -1.0)):g}",
        "--auto_stop_method", str(e.get("auto_stop_method") or "None"),
        "--job_dir", job_dir,
    ]
    return argv


def _drop_flag(argv: list[str], flag: str) -> list[str]:
    """*argv* without *flag* and the values after it."""
    if flag not in argv:
        return argv
    i = argv.index(flag)
    j = i + 1
    while j < len(argv) and not argv[j].startswith("--"):
        j += 1
    return argv[:i] + argv[j:]


def _set_flag(argv: list[str], flag: str, value: str) -> list[str]:
    argv = list(argv)
    argv[argv.index(flag) + 1] = value
    return argv


def for_fms_hf_tuning(argv: list[str], *, method: str, fast_moe: int, cpu: bool, flash_attn: bool, version: str,
                      python: str, adjustments: list[str]) -> list[str]:
    """The fms-hf-tuning trainer's command line from :func:`train_argv`'s: the seed's, as written, with what a
    CPU partition (*cpu*) and an environment without flash-attn (*flash_attn* False) change, each appended
    to *adjustments*."""
    if method == "pt":
        # The seed's prompt-tuning command line passes --peft_method none: run it as written.
        argv = _set_flag(_drop_flag(_drop_flag(argv, "--num_virtual_tokens"), "--prompt_tuning_init"),
                         "--peft_method", "none")
    if not fast_moe:
        argv = _drop_flag(argv, "--fast_moe")
        adjustments.append("fms-hf-tuning: --fast_moe omitted (0): the release turns ScatterMoE on for any value "
                           "once fms-acceleration is installed")
    if cpu:
        argv = _set_flag(_set_flag(_set_flag(argv, "--use_flash_attn", "False"), "--torch_dtype", "float32"),
                         "--bf16", "False") + ["--use_cpu", "True"]
        adjustments[:] = [a for a in adjustments if not a.startswith("cpu partition: the runner loads float32")]
        adjustments.append("cpu partition: fms-hf-tuning gets --use_flash_attn False --torch_dtype float32 --bf16 "
                           "False (flash-attention and bf16 need CUDA) and --use_cpu True (without it transformers "
                           "4.x leaves the processes undistributed: each would train on the whole dataset)")
    elif argv[argv.index("--use_flash_attn") + 1] == "True" and not flash_attn:
        # sbench builds the release as pinned, without the flash-attn extra (a CUDA source build).
        argv = _set_flag(argv, "--use_flash_attn", "False")
        adjustments.append(f"fms-hf-tuning=={version}: its environment has no flash-attn, so --use_flash_attn False "
                           f"(sdpa attention); for the reference's attention: {python} -m pip install flash-attn, "
                           f"then sbench env build fms-hf-tuning=={version} --refresh")
    return argv


def smoke_argv(model: str, dataset_path: str, job_dir: str, steps: int) -> list[str]:
    """The command line of a trainer environment's smoke run: *steps* steps of a LoRA job of the tiny model on
    a CPU partition, with its output in *job_dir*, as a job of the fms-hf-tuning trainer would run it."""
    exp = get_experiment(SMOKE_EXPERIMENT)
    e = {"model_max_length": SMOKE_SEQ_LEN, "max_steps": steps, "gradient_accumulation_steps": 1,
         "torch_dtype": "float32"}
    argv = train_argv(exp, e, model, dataset_path, job_dir, SMOKE_BATCH, SMOKE_TARGET_MODULES)
    return for_fms_hf_tuning(argv, method=exp.method, fast_moe=0, cpu=True, flash_attn=False, version="",
                             python="", adjustments=[])
