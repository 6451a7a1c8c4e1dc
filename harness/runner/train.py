"""The training process: ``python -m harness.runner.train <reference flags>``.

Launched by the node runner, either directly (one device) or under ``accelerate launch`` (one
process per device; accelerate's environment selects DDP or FSDP and the HF Trainer picks it
up). It takes the reference command line of the fms-hf-tuning experiments flag for flag and
trains with trl's ``SFTTrainer`` (+ peft for LoRA and prompt tuning), loading the model
through the ordinary ``from_pretrained`` path (a local directory, or an HF id via HF_HOME).

Per rank it writes, in the job directory (``--job_dir``):

- stage events ``launch``, ``dataset``, ``tokens``, ``model_load``, ``train`` to ``stages.<host>.jsonl``;
- ``rank.<rank>.json``: environment, device, notes and the measurements (see
  :func:`harness.runner.measure.measurements`); rank 0 also writes ``log_history.json``;
- ``error.<rank>.json`` when it catches an exception, classified ``invalid`` (GPU OOM or
  illegal memory access) or ``failed`` (see :mod:`harness.runner.classify`).

On a machine without CUDA, bf16/fp16 and flash-attention are turned off and weights load as
float32; where the flash_attn package is missing or does not load, attention is sdpa. ``rank.<rank>.json``
records what ran (``ran``: read off the loaded model and the Trainer) and each setting that differs from what
the point asked (``adjustments``, each also a note); GPTQ-LoRA needs CUDA and fails with a clear reason. On CUDA,
where Triton cannot build a kernel (no C compiler or python headers), trl computes its loss with its torch path
instead of its Triton kernels (a note says so).

Measurements (``metrics``; all over the *measured window*: from the start of training, or under
auto-stop from the end of warm-up, to the end of the last optimiser step): dataset tokens are
the exact non-padding tokens of the entries processed, counted from the real batches by a
wrapper around the data collator; train tokens include padding. As in the reference,
``train_samples[_per_second]`` and ``dataset_tokens[_per_second]`` are the run's (all ranks, one
all-reduce at the end; ``dataset_tokens_per_second_per_gpu`` divides by the world size), while
``train_tokens[_per_second]`` are this rank's; ``rank_*`` keys hold this rank's share of the
others, and ``totals`` the whole run including warm-up.

Stopping: ``--stop_after_seconds S`` stops after the first optimiser step ending S seconds
after training started; ``--auto_stop_method WARMUP_60S_STABLE_120S_OR_10_STEPS`` ends warm-up
at the first step end after ``runner.warmup_seconds`` (spec.json; default 60) and stops once
both ``runner.stable_seconds`` (120) have passed and ``runner.min_steps`` (10) steps were done
since (``runner.stop_method`` ``fixed``, the default). With ``runner.stop_method`` ``precision``
(:mod:`harness.runner.steady`) the window is MSER-5's steady state, and training stops once its
throughput's 95 % interval is within ``runner.rel_ci``, or after ``runner.max_seconds``. Rank 0
decides and broadcasts the decision every step, so all ranks stop together.

Tests inject failures with ``SBENCH_FAULT`` (see :mod:`harness.runner.faults`), e.g.
``SBENCH_FAULT=oom@step=2`` raises ``torch.OutOfMemoryError`` at the end of step 2,
``sigkill@step=2,rank=1`` kills rank 1 with SIGKILL, ``sleep@step=1:30`` hangs for 30 s.

This module holds what only the sbench trainer does: what it can run on this machine, and :func:`run`. The
rest it shares with the fms-hf-tuning trainer (:mod:`harness.runner.fms`): the command line
(:mod:`~harness.runner.cmdline`), the rank's frame (:mod:`~harness.runner.rank`: context, launch stage, error
classification, ``rank.<rank>.json``), the measurements and the stop policy (:mod:`~harness.runner.measure`)
and what ran (:mod:`~harness.runner.devices`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import time
from typing import Any

from harness.contract.atomic import write_json
from harness.contract.formats import Stage
from harness.data.prepared import PREP_DIR, TOKEN_CACHE_DIR, Prepared, ensure_prepared, lengths_and_empty
from harness.data.tokens import dataset_token_counts, encode_for_training
from harness.data.vision import (
    entry_images,
    entry_text,
    image_token_id,
    load_processor,
    open_vision_dataset,
    vision_token_counts,
)
from harness.data.visionprep import VISION_TEXT, ensure_vision_prepared
from harness.spec.flops import model_counts

from . import rank
from .devices import backend_name, device_info, flash_attn_problem, triton_build_problem, what_ran, wrapping
from .measure import CountingCollator, Meter, StopPolicy, make_callback, measurements, run_totals
from .memsnap import MemoryRecorder
from .rank import Context, launch_end


# Defined in the entry module: error.<rank>.json names an exception by its module (classify.error_type), and
# collect shows that name in the run's reason.
class TrainerSetupError(RuntimeError):
    """A configuration this trainer cannot run here (e.g. GPTQ without CUDA); classified failed."""


# -- what this machine runs ------------------------------------------------------------------------

def resolve_settings(args: argparse.Namespace, ctx: Context) -> dict[str, Any]:
    """What this machine will actually run: CPU turns off bf16/fp16/flash-attention and uses float32."""
    import torch  # heavy: only where a model is built or trained

    cuda = torch.cuda.is_available()
    s: dict[str, Any] = {"cuda": cuda, "torch_dtype": args.torch_dtype, "bf16": args.bf16, "fp16": args.fp16,
                         "attn_implementation": "sdpa"}
    if args.auto_gptq:
        if not cuda:
            raise TrainerSetupError(f"GPTQ-LoRA (--auto_gptq {' '.join(args.auto_gptq)}) needs a CUDA GPU and its "
                                    "triton kernels; this machine has no CUDA device")
        raise TrainerSetupError(f"GPTQ-LoRA (--auto_gptq {' '.join(args.auto_gptq)}, --fused_lora, --fast_kernels) "
                                "needs the fms-acceleration plugins, which the sbench trainer does not include")
    if args.fast_moe and args.fast_moe > 0:
        raise TrainerSetupError(f"--fast_moe {args.fast_moe} needs fms-acceleration's MoE plugin, which the sbench "
                                "trainer does not include")
    if args.fast_kernels and any(args.fast_kernels):
        raise TrainerSetupError("--fast_kernels needs fms-acceleration's kernels, which the sbench trainer does "
                                "not include")
    if args.use_qlora:
        if not cuda:
            raise TrainerSetupError("--use_qlora loads 4-bit NF4 weights with bitsandbytes' CUDA kernels; this "
                                    "machine has no CUDA device")
        if args.peft_method != "lora":
            raise TrainerSetupError(f"--use_qlora needs --peft_method lora (got {args.peft_method})")
        try:
            import bitsandbytes  # noqa: F401
        except ImportError:
            raise TrainerSetupError("--use_qlora needs the bitsandbytes package in the jobs' python") from None
    if str(args.training_data_path).endswith(".parquet") and not args.dataset_image_field:
        raise TrainerSetupError(f"{args.training_data_path}: a vision (image + text) dataset needs "
                                "--dataset_image_field (the column of its images)")
    if args.dataset_image_field and args.peft_method == "pt":
        raise TrainerSetupError("prompt tuning of a vision-language model is not run by the sbench trainer (the "
                                "virtual tokens shift the image-token positions the model merges its features into)")
    if args.packing:
        raise TrainerSetupError("--packing True is not supported: the reference experiments run with packing False")
    # Each change shows in rank.<rank>.json's adjustments once the model is loaded (what_ran).
    if not cuda:
        s.update(torch_dtype="float32", bf16=False, fp16=False)
    elif args.use_flash_attn and flash_attn_problem() is None:
        s["attn_implementation"] = "flash_attention_2"
    dtype = getattr(torch, s["torch_dtype"], None)
    if not isinstance(dtype, torch.dtype):
        raise TrainerSetupError(f"--torch_dtype {args.torch_dtype!r} is not a torch dtype")
    s["dtype"] = dtype
    return s


def qlora_kwargs(args: argparse.Namespace, dtype: Any) -> dict[str, Any]:
    """``from_pretrained`` arguments of a QLoRA run: every linear layer but the LM head in 4-bit NF4 with
    double quantisation, computing (and stored, so FSDP can shard it) in the run's dtype."""
    if not args.use_qlora:
        return {}
    from transformers import BitsAndBytesConfig  # heavy: only where a model is built or trained

    return {"quantization_config": BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=dtype, bnb_4bit_quant_storage=dtype)}


def trl_triton_off() -> bool:
    """Make trl compute its loss (and entropy) with its torch tiles instead of its Triton kernels; True when it
    had the switches this knows (trl 1.x: the kernels module's availability flag and the trainer utilities' check)."""
    import trl.kernels.chunked_logprob as chunked  # heavy: only where a model is trained
    import trl.trainer.utils as trl_utils  # heavy: as above

    known = hasattr(chunked, "_TRITON_AVAILABLE") and hasattr(trl_utils, "is_triton_available")
    if known:
        chunked._TRITON_AVAILABLE = False
        trl_utils.is_triton_available = lambda: False
    return known


def deepspeed_left_out() -> bool:
    """Where the launch is not DeepSpeed's, keep accelerate from importing DeepSpeed to unwrap the model (its
    ``extract_model_from_parallel`` imports ``deepspeed`` whenever it is installed: CPU seconds of every rank, and
    DeepSpeed's accelerator lines in its log); True when it had the switch this knows."""
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() in ("1", "true", "yes"):
        return False
    import accelerate.utils.other as other  # heavy: only where a model is trained

    if not callable(getattr(other, "is_deepspeed_available", None)):
        return False
    other.is_deepspeed_available = lambda: False
    return True


def checkpointing_args(config_cls: Any, enabled: bool, kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """The Trainer's activation-checkpointing arguments, under the names *config_cls* (``SFTConfig``) has: since
    transformers 5.2x ``activation_checkpointing`` (``gradient_checkpointing`` is its deprecated alias there),
    before that ``gradient_checkpointing``, which those releases alone know."""
    names = {f.name for f in dataclasses.fields(config_cls)}
    key = "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"
    return {key: enabled, f"{key}_kwargs": kwargs}


def enable_cpu_fsdp(trainer: Any) -> bool:
    """Make FSDP from ``accelerate launch`` (``ACCELERATE_USE_FSDP``) take effect on CPU.

    accelerate's ``AcceleratorState`` turns FSDP on only when the distributed type is an
    accelerator one (MULTI_GPU, ...); on CPU the launcher's FSDP settings are silently dropped
    and the run becomes plain DDP over gloo. FSDP v2 (``fully_shard``) does run on CPU over
    gloo, so set the state to FSDP with the plugin accelerate built from the launcher's
    environment, and tell the Trainer (which read the state while it was MULTI_CPU).
    """
    from accelerate.state import PartialState  # heavy: only where a model is trained
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin  # heavy: only where a model is trained

    state = trainer.accelerator.state
    if (os.environ.get("ACCELERATE_USE_FSDP", "false").lower() != "true"
            or state.distributed_type != DistributedType.MULTI_CPU):
        return False
    plugin = FullyShardedDataParallelPlugin()  # from the FSDP_* variables accelerate launch exported
    if plugin.fsdp_version != 2:
        raise TrainerSetupError("FSDP v1 needs an accelerator; on CPU accelerate.yaml must set fsdp_version: 2")
    state.distributed_type = DistributedType.FSDP
    state.fsdp_plugin = plugin
    # As accelerate does when it sets FSDP up itself: every later AcceleratorState() copies the partial
    # state over its own, which would turn this one back into MULTI_CPU (DDP wrapping, no_sync, ...).
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    trainer.is_fsdp_enabled = True
    return True


# Modules of a vision-language model that are not its language model: LoRA leaves them frozen.
VISION_PARTS = ("vision_tower", "vision_model", "multi_modal_projector", "visual", "image_newline")


def lm_only_targets(modules: list[str] | None) -> str | None:
    """PEFT's ``target_modules`` as one regular expression (PEFT full-matches a string against each module
    name): the named modules of the language model, none of the vision tower's or the projector's."""
    if not modules:
        return None
    names = "|".join(re.escape(m) for m in modules)
    parts = "|".join(VISION_PARTS)
    return rf"^(?!.*\b({parts})\b).*\.({names})$"


def _peft_config(args: argparse.Namespace, tokenizer_path: str) -> Any:
    if args.peft_method == "lora":
        from peft import LoraConfig  # heavy: only where a model is trained

        targets: Any = lm_only_targets(args.target_modules) if args.dataset_image_field else args.target_modules
        return LoraConfig(r=args.r, lora_alpha=args.lora_alpha, lora_dropout=args.lora_dropout,
                          target_modules=targets, task_type="CAUSAL_LM", bias="none")
    if args.peft_method == "pt":
        from peft import PromptTuningConfig  # heavy: only where a model is trained

        kw: dict[str, Any] = {}
        if args.prompt_tuning_init == "TEXT":
            kw = {"prompt_tuning_init_text": args.prompt_tuning_init_text or "Continue the news story.",
                  "tokenizer_name_or_path": tokenizer_path}
        return PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=args.num_virtual_tokens,
                                  prompt_tuning_init=args.prompt_tuning_init, **kw)
    return None


def _record_prepared(ctx: Context, info: dict[str, Any], doc: dict[str, Any], prep: Prepared) -> None:
    """The prepared entry a job opened, in its dataset stage and rank file; a note when the job had to build it."""
    info["prepared"] = doc["prepared"] = prep.summary()
    if prep.status != "hit":
        note = (f"training data {prep.status} in the job ({prep.reason}; {prep.build_s or 0:.1f} s): it was "
                "not prepared before the job started; run 'sbench prepare SWEEP' before submitting")
        ctx.note(note)
        info["note"] = note


def _text_data(args: argparse.Namespace, ctx: Context, state: Any, doc: dict[str, Any]) -> tuple[Any, Any]:
    """The stages ``dataset`` and ``tokens`` of a text dataset: the tokenizer, and the encoded training data
    (prepared once and shared where the token cache is on), with note 3's exact counts."""
    from transformers import AutoTokenizer  # heavy: only where a model is built or trained

    with ctx.log.stage(Stage.DATASET) as info:
        ctx.fault_at_stage(Stage.DATASET)
        tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        if ctx.runner.token_cache:
            # Rank 0 first: it builds the shared entry if it is missing, the others then map it.
            with state.main_process_first():
                prep = ensure_prepared(tokenizer, args.training_data_path, text_field=args.dataset_text_field,
                                       max_seq_length=args.max_seq_length, response_template=args.response_template,
                                       root=ctx.data_dir / PREP_DIR, token_cache=ctx.data_dir / TOKEN_CACHE_DIR)
            data, dataset_sha = prep.dataset, prep.doc.get("dataset_sha256")
            _record_prepared(ctx, info, doc, prep)
        else:
            data = encode_for_training(tokenizer, args.training_data_path, text_field=args.dataset_text_field,
                                       max_seq_length=args.max_seq_length, response_template=args.response_template)
            info["prepared"], dataset_sha = None, None
        lengths, no_completion = lengths_and_empty(data.data.table.column("completion_mask"))
        if no_completion:
            ctx.note(f"{no_completion} of {len(data)} entries have no response token within max_seq_length "
                     f"{args.max_seq_length}; their loss is masked, as with the reference completion-only collator")
        info.update(entries=len(data), tokens=sum(lengths), path=str(args.training_data_path),
                    entries_without_completion=no_completion)

    with ctx.log.stage(Stage.TOKENS) as info:
        ctx.fault_at_stage(Stage.TOKENS)
        cache_dir = ctx.data_dir / TOKEN_CACHE_DIR if ctx.runner.token_cache else None
        # Rank 0 counts (or reads the cache) first, so the others hit the cache it wrote.
        with state.main_process_first():
            counts = dataset_token_counts(tokenizer, args.training_data_path, text_field=args.dataset_text_field,
                                          max_seq_length=args.max_seq_length, cache_dir=cache_dir,
                                          dataset_sha=dataset_sha)
        summary = counts.summary()
        summary["cache_dir"] = str(cache_dir) if cache_dir else None
        summary["elapsed_s"] = counts.elapsed_s
        summary["matches_training_data"] = counts.counts == lengths
        if not summary["matches_training_data"]:
            ctx.note("dataset_token_counts disagree with the encoded training data; dataset_tokens come from "
                     "the batches")
        doc["dataset_token_counts"] = summary
        info.update(summary)

    return tokenizer, data


class VisionCollator:
    """The batch of a vision dataset, as fms-hf-tuning's ``VisionDataCollator`` makes it: the processor on the
    entries' rendered texts and images (padded, not truncated), labels = the input ids with padding and image
    tokens masked. Reports each batch to the :class:`Meter`: entries, the exact tokens the model sees (text and
    image: the attention mask's ones), the tokens with padding, and the image tokens."""

    def __init__(self, processor: Any, image_field: str, meter: Meter) -> None:
        self.processor, self.image_field, self.meter = processor, image_field, meter
        self.image_id = image_token_id(processor)

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        texts = [e[VISION_TEXT] for e in examples]
        images = [entry_images(e, self.image_field) for e in examples]
        batch = self.processor(text=texts, images=images, padding=True, return_tensors="pt")
        ids, mask = batch["input_ids"], batch["attention_mask"]
        image = ids == self.image_id
        labels = ids.clone()
        labels[(mask == 0) | image] = -100
        batch["labels"] = labels
        self.meter.pending.append((len(examples), int(mask.sum()), int(ids.numel()), int((image & (mask == 1)).sum())))
        return batch


def _vision_data(args: argparse.Namespace, ctx: Context, state: Any, doc: dict[str, Any]) -> tuple[Any, Any]:
    """The stages ``dataset`` and ``tokens`` of a vision dataset: the processor, and the entries with their text
    rendered (its messages through the processor's chat template, as fms-hf-tuning's data handler does),
    prepared once and shared where the token cache is on, with exact text and image token counts."""
    with ctx.log.stage(Stage.DATASET) as info:
        ctx.fault_at_stage(Stage.DATASET)
        processor = load_processor(args.model_name_or_path)
        if processor.tokenizer.pad_token is None:
            processor.tokenizer.pad_token = processor.tokenizer.eos_token
        dataset_sha = None
        if ctx.runner.token_cache:
            # Rank 0 first: it builds the shared entry if it is missing, the others then map it.
            with state.main_process_first():
                prep = ensure_vision_prepared(processor, args.training_data_path, text_field=args.dataset_text_field,
                                              image_field=args.dataset_image_field, root=ctx.data_dir / PREP_DIR,
                                              token_cache=ctx.data_dir / TOKEN_CACHE_DIR)
            data, dataset_sha = prep.dataset, prep.doc.get("dataset_sha256")
            _record_prepared(ctx, info, doc, prep)
        else:
            data = open_vision_dataset(args.training_data_path)
            if args.dataset_image_field not in data.column_names:
                raise TrainerSetupError(f"{args.training_data_path}: no column {args.dataset_image_field!r} "
                                        f"(--dataset_image_field); it has {', '.join(data.column_names)}")
            texts = [entry_text(processor, row, args.dataset_text_field)
                     for row in data.remove_columns([args.dataset_image_field])]
            data = data.add_column(VISION_TEXT, texts)
            info["prepared"] = None
        info.update(entries=len(data), path=str(args.training_data_path), image_field=args.dataset_image_field)
    with ctx.log.stage(Stage.TOKENS) as info:
        ctx.fault_at_stage(Stage.TOKENS)
        cache_dir = ctx.data_dir / TOKEN_CACHE_DIR if ctx.runner.token_cache else None
        with state.main_process_first():
            vc = vision_token_counts(processor, args.training_data_path, text_field=args.dataset_text_field,
                                     image_field=args.dataset_image_field, cache_dir=cache_dir, dataset_sha=dataset_sha)
        summary = {**vc.summary(), "elapsed_s": vc.elapsed_s, "cache_dir": str(cache_dir) if cache_dir else None}
        doc["dataset_token_counts"] = summary
        info.update(summary)
    ctx.note("vision dataset: entries are not truncated to max_seq_length (cutting into an image's tokens "
             "breaks its features; fms-hf-tuning's vision collator does not truncate either): dataset tokens "
             "count every text and image token the model sees")
    return processor, data


# -- the run --------------------------------------------------------------------------------------

def run(args: argparse.Namespace, ctx: Context) -> dict[str, Any]:
    doc = ctx.doc
    settings = resolve_settings(args, ctx)  # before the heavy imports: a config that cannot run fails fast

    from accelerate import PartialState  # heavy: only where a model is trained
    from transformers import (  # heavy: only where a model is built or trained
        AutoModelForCausalLM,
        AutoModelForImageTextToText,
    )
    from trl import SFTConfig, SFTTrainer  # heavy: only where a model is trained
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling  # heavy: only where a model is trained

    doc["settings"] = {k: (str(v) if k == "dtype" else v) for k, v in settings.items()}
    doc["device"] = device_info(ctx.local_rank)
    problem = triton_build_problem() if settings["cuda"] else None
    if problem is not None:
        # trl's fused loss runs Triton kernels on CUDA; one that cannot be built would fail every step.
        doc["settings"]["trl_triton_kernels"] = False
        if trl_triton_off():
            ctx.note(f"trl's Triton loss kernels are off ({problem}); its torch path computes the same loss")
        else:
            ctx.note(f"{problem}; this trl has no switch sbench knows to use its torch path: its Triton kernels "
                     "may fail")
    gc_kwargs = dict(args.gradient_checkpointing_kwargs or {})
    deepspeed_left_out()

    # Created first: everything below can then use the process group (gloo on CPU).
    t_imported = time.time()
    state = PartialState(cpu=not settings["cuda"])
    launch_end(ctx, t_imported)

    vision = bool(args.dataset_image_field)
    if vision:
        processor, data = _vision_data(args, ctx, state, doc)
        tokenizer = processor.tokenizer
    else:
        tokenizer, data = _text_data(args, ctx, state, doc)

    with ctx.log.stage(Stage.MODEL_LOAD) as info:
        ctx.fault_at_stage(Stage.MODEL_LOAD)
        if ctx.world_size > 1:
            os.environ.setdefault("FSDP_USE_ORIG_PARAMS", str(args.fsdp_use_orig_params).lower())
        meter = Meter()
        if vision:
            model = AutoModelForImageTextToText.from_pretrained(
                args.model_name_or_path, dtype=settings["dtype"], attn_implementation=settings["attn_implementation"],
                **qlora_kwargs(args, settings["dtype"]))
            collator: Any = VisionCollator(processor, args.dataset_image_field, meter)
        else:
            model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path, dtype=settings["dtype"],
                                                         attn_implementation=settings["attn_implementation"],
                                                         **qlora_kwargs(args, settings["dtype"]))
            collator = CountingCollator(DataCollatorForLanguageModeling(pad_token_id=tokenizer.pad_token_id), meter)

        config = SFTConfig(
            output_dir=args.output_dir, per_device_train_batch_size=args.per_device_train_batch_size,
            gradient_accumulation_steps=args.gradient_accumulation_steps, num_train_epochs=args.num_train_epochs,
            max_steps=args.max_steps, learning_rate=args.learning_rate, weight_decay=args.weight_decay,
            warmup_steps=args.warmup_ratio, lr_scheduler_type=args.lr_scheduler_type,
            logging_strategy="steps", logging_steps=args.logging_steps, save_strategy="no", eval_strategy="no",
            report_to="none", optim=args.optim, optim_args=args.optim_args, bf16=settings["bf16"],
            fp16=settings["fp16"], use_cpu=not settings["cuda"],
            **checkpointing_args(SFTConfig, args.gradient_checkpointing, gc_kwargs or None),
            max_length=args.max_seq_length, packing=False,
            dataset_text_field=args.dataset_text_field, dataset_kwargs={"skip_prepare_dataset": True},
            log_level=args.log_level, disable_tqdm=True, seed=args.seed, dataloader_num_workers=0,
            include_num_input_tokens_seen="no",
            # The collator needs completion_mask (it builds the labels), so the Trainer must not drop it.
            remove_unused_columns=False,
        )
        policy = StopPolicy.of(args, ctx.runner)
        timeline: dict[str, Any] = {}
        memory = MemoryRecorder(ctx.runner.memory_every_steps, None)

        class BenchTrainer(SFTTrainer):
            def create_accelerator_and_postprocess(self) -> None:
                super().create_accelerator_and_postprocess()
                if enable_cpu_fsdp(self):
                    ctx.note("FSDP on CPU: accelerate's state only enables FSDP for accelerator devices; "
                             "switched the MULTI_CPU state to FSDP (gloo) as accelerate.yaml asks")

            def training_step(self, model, inputs, *a, **kw):
                meter.consumed(inputs)
                return super().training_step(model, inputs, *a, **kw)

        trainer = BenchTrainer(model=model, args=config, train_dataset=data,
                               processing_class=processor if vision else tokenizer,
                               data_collator=collator, peft_config=_peft_config(args, args.model_name_or_path),
                               callbacks=[make_callback(ctx, meter, policy, timeline, memory)])
        acc = trainer.accelerator
        memory.engine_of = lambda: getattr(getattr(acc, "deepspeed_engine_wrapped", None), "engine", None)
        dist = {"distributed_type": str(acc.distributed_type).split(".")[-1], "num_processes": acc.num_processes,
                "backend": backend_name(),
                "fsdp_version": getattr(getattr(acc.state, "fsdp_plugin", None), "fsdp_version", None),
                "requested": args.distributed_backend,
                "zero_stage": getattr(getattr(acc.state, "deepspeed_plugin", None), "zero_stage", None)}
        doc["distributed"] = dist
        assert trainer.model is not None  # built with model=, the Trainer always holds one
        ctx.record_ran(*what_ran(ctx.asked, trainer.model, trainer.args.bf16, trainer.args.fp16, settings["cuda"]))
        params = sum(p.numel() for p in trainer.model.parameters())
        trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
        doc["model"] = {"source": args.model_name_or_path, "class": type(model).__name__, "parameters": params,
                        "trainable_parameters": trainable, "peft_method": args.peft_method}
        # What the FLOPs formula needs (harness.spec.flops): collect turns it into model TFLOP/s and MFU.
        doc["flops"] = {**model_counts(trainer.model, model.config),
                        "gradient_checkpointing": bool(args.gradient_checkpointing)}
        info.update(dist, parameters=params, trainable_parameters=trainable)

    with ctx.log.stage(Stage.TRAIN) as info:
        ctx.fault_at_stage(Stage.TRAIN)
        out = trainer.train()
        m = measurements(timeline, policy, trainer.state.max_steps if args.max_steps > 0 else -1)
        if m.get("metrics"):
            run_totals(m["metrics"], ctx.world_size, trainer.args.device)
        m["hf_metrics"] = dict(out.metrics)
        m["memory"] = memory.snaps
        doc["distributed"].update(wrapping(trainer))
        m["training_loss"] = out.training_loss
        m["meter"] = {"mismatches": meter.mismatches, "unconsumed_batches": len(meter.pending)}
        doc.update(m)
        policy.record(doc, args, ctx)
        info.update(global_step=m["global_step"], stopped_by=m["stopped_by"],
                    train_runtime=(m.get("metrics") or {}).get("train_runtime"))
        if ctx.rank == 0 and ctx.paths is not None:
            write_json(ctx.paths.log_history, trainer.state.log_history)
    return doc


def main(argv: list[str] | None = None) -> int:
    """Run one rank of the sbench trainer (:func:`harness.runner.rank.main` around :func:`run`)."""
    return rank.main(run, argv)


if __name__ == "__main__":
    rank.exit_now(main())
