"""The trainers' command line: the reference's flags, as :mod:`harness.build.trainargs` writes them, read with
argparse. Both trainers parse it here; the fms-hf-tuning trainer then hands the line, without sbench's own
flags, to the release's own parser."""

from __future__ import annotations

import argparse
import json

from harness.contract.defaults import AUTO_STOP
from harness.contract.formats import RESPONSE_TEMPLATE_ARG, TEXT_FIELD


def _bool(text: str) -> bool:
    t = str(text).strip().lower()
    if t in ("true", "1", "yes", "y", "on"):
        return True
    if t in ("false", "0", "no", "n", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected True or False, got {text!r}")


def _none_str(text: str) -> str | None:
    return None if str(text).strip().lower() in ("none", "null", "") else text


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m harness.runner.train", allow_abbrev=False,
                                description="sbench trainer: the reference SFT command line on trl's SFTTrainer")
    a = p.add_argument
    a("--model_name_or_path", required=True)
    a("--training_data_path", required=True)
    a("--output_dir", required=True)
    a("--job_dir", default=None, help="job directory for stage events and results (default: none written)")
    a("--torch_dtype", default="bfloat16")
    a("--use_flash_attn", type=_bool, default=True)
    a("--response_template", default=RESPONSE_TEMPLATE_ARG)
    a("--dataset_text_field", default=TEXT_FIELD)
    a("--dataset_image_field", default=None, help="image column of a vision (image + text) dataset")
    a("--dataset_conversation_field", default=None, help="chat messages column of a vision dataset")
    a("--remove_unused_columns", type=_bool, default=True)
    a("--log_level", default="passive")
    a("--num_train_epochs", type=float, default=1.0)
    a("--max_steps", type=int, default=-1)
    a("--per_device_train_batch_size", type=int, default=1)
    a("--max_seq_length", type=int, required=True)
    a("--eval_strategy", default="no", choices=["no"])
    a("--gradient_accumulation_steps", type=int, default=1)
    a("--save_strategy", default="no", choices=["no"])
    a("--learning_rate", type=float, default=1e-5)
    a("--weight_decay", type=float, default=0.0)
    a("--warmup_ratio", type=float, default=0.03)
    a("--lr_scheduler_type", default="cosine")
    a("--logging_steps", type=float, default=1)
    a("--include_tokens_per_second", type=_bool, default=True)
    a("--gradient_checkpointing", type=_bool, default=True)
    a("--gradient_checkpointing_kwargs", default=None, help='JSON, e.g. {"use_reentrant": false}')
    a("--packing", type=_bool, default=False)
    a("--peft_method", default="none", choices=["none", "lora", "pt"])
    a("--target_modules", nargs="+", default=None)
    a("--r", type=int, default=4)
    a("--lora_alpha", type=int, default=16)
    a("--lora_dropout", type=float, default=0.05)
    a("--num_virtual_tokens", type=int, default=20)
    a("--prompt_tuning_init", default="RANDOM", choices=["RANDOM", "TEXT"])
    a("--prompt_tuning_init_text", default=None)
    a("--fp16", type=_bool, default=False)
    a("--bf16", type=_bool, default=False)
    a("--fast_kernels", nargs=3, type=_bool, default=None, metavar=("FAST_LOSS", "FAST_RMS", "FAST_ROPE"))
    a("--fused_lora", nargs=2, default=None, metavar=("BASE", "FLAG"))
    a("--auto_gptq", nargs="+", default=None)
    a("--optim", default="adamw_torch")
    a("--optim_args", default=None)
    a("--fast_moe", type=int, default=0)
    a("--distributed_backend", type=_none_str, default=None)
    a("--fsdp_use_orig_params", type=_bool, default=True)
    a("--use_qlora", type=_bool, default=False)
    a("--stop_after_seconds", type=float, default=-1.0)
    a("--auto_stop_method", type=_none_str, default=None)
    a("--seed", type=int, default=42)
    # Given to the fms-hf-tuning trainer on CPU partitions; this trainer decides from torch.cuda itself.
    a("--use_cpu", type=_bool, default=None)
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    if args.gradient_checkpointing_kwargs:
        try:
            gk = json.loads(args.gradient_checkpointing_kwargs)
        except json.JSONDecodeError as exc:
            build_parser().error(f"--gradient_checkpointing_kwargs is not JSON: {exc}")
        if not isinstance(gk, dict):
            build_parser().error("--gradient_checkpointing_kwargs must be a JSON object")
        args.gradient_checkpointing_kwargs = gk
    if args.auto_stop_method not in (None, AUTO_STOP):
        build_parser().error(f"--auto_stop_method must be None or {AUTO_STOP}, got {args.auto_stop_method!r}")
    return args
