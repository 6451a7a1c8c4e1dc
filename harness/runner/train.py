"""The training process: ``python -m harness.runner.train <reference flags>``.

Launched by the node runner, either directly (one device) or under ``accelerate launch`` (one
process per device; accelerate's environment selects DDP or FSDP and the HF Trainer picks it
up). It takes the reference command line of the fms-hf-tuning experiments flag for flag and
trains with trl's ``SFTTrainer`` (+ peft for LoRA and prompt tuning), loading the model
through the ordinary ``from_pretrained`` path (a local directory, or an HF id via HF_HOME).

Per rank it writes, in the job directory (``--job_dir``):

- stage events ``dataset``, ``tokens``, ``model_load``, ``train`` to ``stages.<host>.jsonl``;
- ``rank.<rank>.json``: environment, device, notes and the measurements (see
  :func:`measurements`); rank 0 also writes ``log_history.json``;
- ``error.<rank>.json`` when it catches an exception, classified ``invalid`` (GPU OOM or
  illegal memory access) or ``failed`` (see :mod:`harness.runner.classify`).

On a machine without CUDA, bf16/fp16 and flash-attention are turned off and weights load as
float32, each with a note in ``rank.<rank>.json``; GPTQ-LoRA needs CUDA and fails with a
clear reason.

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
since. Rank 0 decides and broadcasts the decision every step, so all ranks stop together.

Tests inject failures with ``SBENCH_FAULT`` (see :mod:`harness.runner.faults`), e.g.
``SBENCH_FAULT=oom@step=2`` raises ``torch.OutOfMemoryError`` at the end of step 2,
``sigkill@step=2,rank=1`` kills rank 1 with SIGKILL, ``sleep@step=1:30`` hangs for 30 s.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.contract import envvars
from harness.contract.defaults import AUTO_STOP, RunnerSettings
from harness.contract.formats import RESPONSE_TEMPLATE_ARG, TEXT_FIELD, Stage
from harness.contract.paths import JobPaths
from harness.data.prepared import PREP_DIR, TOKEN_CACHE_DIR, ensure_prepared
from harness.data.tokens import dataset_token_counts, encode_for_training
from harness.spec.flops import model_counts

from .classify import error_record
from .envcapture import relevant_env
from .faults import Fault, faults_from_env
from .memsnap import MemoryRecorder
from .stages import StageLog, Terminated

MODULE_START_WALL = time.time()  # this process's start as the launch stage sees it (the heavy imports come later)

STOP_REASONS = (None, "stop_after_seconds", "auto_stop")  # index = the code rank 0 broadcasts


class TrainerSetupError(RuntimeError):
    """A configuration this trainer cannot run here (e.g. GPTQ without CUDA); classified failed."""


# -- command line -------------------------------------------------------------------------------

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


# -- per-process context ------------------------------------------------------------------------

@dataclass
class Context:
    rank: int
    local_rank: int
    world_size: int
    host: str
    trial: int | None
    paths: JobPaths | None
    runner: RunnerSettings
    data_dir: Path
    log: StageLog
    faults: list[Fault]
    doc: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    launch: dict[str, float] = field(default_factory=dict)  # the open launch stage's clock readings

    @classmethod
    def from_env(cls, args: argparse.Namespace) -> Context:
        env = os.environ
        rank = int(env.get("RANK", "0"))
        trial_s = envvars.TRIAL.get()
        host = envvars.host()
        paths = JobPaths(args.job_dir) if args.job_dir else None
        runner = RunnerSettings()
        data_dir = Path(args.training_data_path).resolve().parent
        if paths is not None and paths.spec.is_file():
            js = json.loads(paths.spec.read_text()).get("jobspec", {})
            runner = RunnerSettings.from_dict(js.get("runner"))
            if js.get("data_dir"):
                data_dir = Path(js["data_dir"])
        if paths is not None:
            paths.root.mkdir(parents=True, exist_ok=True)
        # SBENCH_STAGE_LOG=0 turns stage events off (bench/overhead.py measures what they cost).
        log = StageLog(paths.stages(host) if paths else "/dev/null", host, rank=rank,
                       trial=int(trial_s) if trial_s else None,
                       enabled=paths is not None and envvars.STAGE_LOG.get() != "0")
        return cls(rank=rank, local_rank=int(env.get("LOCAL_RANK", "0")), world_size=int(env.get("WORLD_SIZE", "1")),
                   host=host, trial=int(trial_s) if trial_s else None, paths=paths, runner=runner,
                   data_dir=data_dir, log=log, faults=faults_from_env())

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(f"sbench[rank {self.rank}]: {text}", file=sys.stderr, flush=True)

    def fault_at_stage(self, stage: str) -> None:
        for f in self.faults:
            if f.applies(rank=self.rank, trial=self.trial, stage=stage):
                f.fire(f"at the start of stage {stage}")

    def fault_at_step(self, step: int) -> None:
        for f in self.faults:
            if f.applies(rank=self.rank, trial=self.trial, step=step):
                f.fire(f"at the end of step {step}")


def _write_json(path: Path, doc: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(doc, indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


# -- measurement --------------------------------------------------------------------------------

class Meter:
    """Counts what the training steps consumed, micro-batch by micro-batch.

    The collator wrapper measures each batch it builds (entries, exact non-padding tokens,
    tokens incl. padding) and queues the numbers; each training step takes the next one off
    the queue. Batches the data loader prefetched but training never used are not counted.
    """

    def __init__(self) -> None:
        self.pending: deque[tuple[int, int, int]] = deque()
        self.samples = 0
        self.dataset_tokens = 0
        self.train_tokens = 0
        self.micro_batches = 0
        self.mismatches = 0

    def collated(self, examples: list[dict[str, Any]], batch: dict[str, Any]) -> None:
        real = sum(len(e["input_ids"]) for e in examples)
        self.pending.append((len(examples), real, int(batch["input_ids"].numel())))

    def consumed(self, inputs: dict[str, Any]) -> None:
        padded_now = int(inputs["input_ids"].numel())
        if self.pending:
            n, real, padded = self.pending.popleft()
            if padded != padded_now:
                self.mismatches += 1
        else:  # not built by our collator: count from the batch itself
            self.mismatches += 1
            n, real, padded = int(inputs["input_ids"].shape[0]), int(inputs["attention_mask"].sum()), padded_now
        self.samples += n
        self.dataset_tokens += real
        self.train_tokens += padded
        self.micro_batches += 1

    def snapshot(self) -> dict[str, float]:
        # cpu_s: this rank's process CPU time (every thread), so its CPU utilisation over the measured
        # window is exact and its own (the sampler sees the node's whole process tree).
        return {"samples": self.samples, "dataset_tokens": self.dataset_tokens, "train_tokens": self.train_tokens,
                "micro_batches": self.micro_batches, "cpu_s": time.process_time()}


class CountingCollator:
    """Wraps a collator; reports every batch it builds to a :class:`Meter`."""

    def __init__(self, inner: Any, meter: Meter) -> None:
        self.inner, self.meter = inner, meter

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        if examples and "completion_mask" in examples[0]:
            # Completion-only loss, as the reference's response-template collator: prompt tokens are -100.
            examples = [{"input_ids": e["input_ids"],
                         "labels": [t if m else -100 for t, m in zip(e["input_ids"], e["completion_mask"])]}
                        for e in examples]
        batch = self.inner(examples)
        self.meter.collated(examples, batch)
        return batch


@dataclass
class StopPolicy:
    stop_after_seconds: float = -1.0
    auto_stop: bool = False
    warmup_seconds: float = RunnerSettings.warmup_seconds
    stable_seconds: float = RunnerSettings.stable_seconds
    min_steps: int = RunnerSettings.min_steps

    @classmethod
    def of(cls, args: argparse.Namespace, runner: RunnerSettings) -> StopPolicy:
        """The command line's stop flags with the spec's auto-stop settings."""
        return cls(stop_after_seconds=args.stop_after_seconds, auto_stop=args.auto_stop_method == AUTO_STOP,
                   warmup_seconds=runner.warmup_seconds, stable_seconds=runner.stable_seconds,
                   min_steps=runner.min_steps)

    def record(self, doc: dict[str, Any], args: argparse.Namespace, ctx: Context) -> None:
        """Say in the rank's document how the run was to stop, once ``doc`` holds its measurements."""
        doc["auto_stop"] = ({"method": args.auto_stop_method, "warmup_seconds": self.warmup_seconds,
                             "stable_seconds": self.stable_seconds, "min_steps": self.min_steps}
                            if self.auto_stop else None)
        doc["stop_after_seconds"] = args.stop_after_seconds
        if self.auto_stop and doc.get("window") != "after_warmup":
            ctx.note("auto-stop: training ended before warm-up did; metrics include warm-up")

    @property
    def active(self) -> bool:
        return self.auto_stop or self.stop_after_seconds > 0

    def decide(self, *, elapsed: float, step: int, warm: bool, warm_elapsed: float | None,
               warm_step: int | None) -> tuple[bool, bool, str | None]:
        """``(stop, warm, reason)`` after a step that ended ``elapsed`` seconds into training."""
        if self.stop_after_seconds > 0 and elapsed >= self.stop_after_seconds:
            return True, warm, "stop_after_seconds"
        if self.auto_stop:
            if not warm:
                if elapsed >= self.warmup_seconds:
                    return False, True, None
                return False, False, None
            assert warm_elapsed is not None and warm_step is not None
            if elapsed - warm_elapsed >= self.stable_seconds and step - warm_step >= self.min_steps:
                return True, True, "auto_stop"
        return False, warm, None


def _make_callback(ctx: Context, meter: Meter, policy: StopPolicy, timeline: dict[str, Any],
                   memory: MemoryRecorder | None = None) -> Any:
    import torch
    from transformers import TrainerCallback

    class BenchCallback(TrainerCallback):
        """Times steps, takes the stop decision (rank 0, broadcast), fires injected faults and takes the
        memory snapshots (harness.runner.memsnap)."""

        def on_train_begin(self, args, state, control, **kw):
            timeline["train_start_wall"], timeline["t0"] = time.time(), time.perf_counter()
            timeline["start_step"] = state.global_step
            timeline["start_counts"] = meter.snapshot()
            if memory is not None:
                memory.device, memory.optimizer = args.device, kw.get("optimizer")
                memory.hook(kw.get("model"), lambda: state.global_step)
                memory.attach_deepspeed(kw.get("model"), lambda: state.global_step)

        def on_step_begin(self, args, state, control, **kw):
            if memory is not None:
                memory.take(kw.get("model"), state.global_step, "before_forward")

        def on_pre_optimizer_step(self, args, state, control, **kw):
            if memory is not None and not memory.deepspeed:
                memory.optimizer = kw.get("optimizer") or memory.optimizer
                memory.take(kw.get("model"), state.global_step, "after_backward")

        def on_optimizer_step(self, args, state, control, **kw):
            if memory is not None and not memory.deepspeed:
                memory.take(kw.get("model"), state.global_step, "after_optimizer")

        def on_step_end(self, args, state, control, **kw):
            now_wall, now = time.time(), time.perf_counter()
            timeline["end_wall"], timeline["t_end"], timeline["end_step"] = now_wall, now, state.global_step
            timeline.setdefault("step_end_wall", []).append(now_wall)  # step-time distribution, stragglers
            timeline["end_counts"] = meter.snapshot()
            ctx.fault_at_step(state.global_step)
            if not policy.active:
                return control
            warm = timeline.get("warm_t") is not None
            stop, warm_now, reason = policy.decide(
                elapsed=now - timeline["t0"], step=state.global_step, warm=warm,
                warm_elapsed=None if not warm else timeline["warm_t"] - timeline["t0"],
                warm_step=timeline.get("warm_step"))
            if ctx.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
                code = STOP_REASONS.index(reason) if stop else 0
                flags = torch.tensor([code, int(warm_now)], dtype=torch.int32, device=args.device)
                torch.distributed.broadcast(flags, src=0)  # rank 0 decides for everyone
                code, warm_now = int(flags[0].item()), bool(flags[1].item())
                stop, reason = code > 0, STOP_REASONS[code]
            if warm_now and not warm:
                timeline["warm_t"], timeline["warmup_end_wall"] = now, now_wall
                timeline["warm_step"], timeline["warm_counts"] = state.global_step, meter.snapshot()
            if stop:
                timeline["stopped_by"] = reason
                control.should_training_stop = True
            return control

    return BenchCallback()


def measurements(timeline: dict[str, Any], policy: StopPolicy, max_steps: int) -> dict[str, Any]:
    """The rank's measured window: after warm-up under auto-stop, otherwise the whole run."""
    out: dict[str, Any] = {
        "train_start_wall": timeline.get("train_start_wall"),
        "train_end_wall": timeline.get("end_wall"),
        "warmup_end_wall": timeline.get("warmup_end_wall"),
    }
    end_step = timeline.get("end_step", 0)
    stopped = timeline.get("stopped_by")
    if stopped is None:
        stopped = "max_steps" if max_steps > 0 and end_step >= max_steps else "epochs"
    out["stopped_by"] = stopped
    out["global_step"] = end_step
    out["step_end_wall"] = timeline.get("step_end_wall", [])
    if "t_end" not in timeline:
        out["metrics"] = None
        return out
    if policy.auto_stop and timeline.get("warm_t") is not None:
        t_start, step0, c0 = timeline["warm_t"], timeline["warm_step"], timeline["warm_counts"]
        out["window"] = "after_warmup"
    else:
        t_start, step0, c0 = timeline["t0"], timeline["start_step"], timeline["start_counts"]
        out["window"] = "whole_run" if not policy.auto_stop else "whole_run_warmup_not_reached"
    c1 = timeline["end_counts"]
    runtime = timeline["t_end"] - t_start
    d = {k: c1[k] - c0[k] for k in c1}
    steps = end_step - step0

    def rate(x: float) -> float | None:
        return x / runtime if runtime > 0 else None

    # Rank-local numbers; run() turns samples and dataset tokens into run totals (all ranks).
    out["metrics"] = {
        "train_runtime": runtime,
        "train_steps": steps,
        "train_steps_per_second": rate(steps),
        "train_tokens": d["train_tokens"],
        "train_tokens_per_second": rate(d["train_tokens"]),
        "rank_train_samples": d["samples"],
        "rank_train_samples_per_second": rate(d["samples"]),
        "rank_dataset_tokens": d["dataset_tokens"],
        "rank_dataset_tokens_per_second": rate(d["dataset_tokens"]),
        "rank_micro_batches": d["micro_batches"],
        "cpu_seconds": d["cpu_s"],
        "cpu_util_pct": 100.0 * d["cpu_s"] / runtime if runtime > 0 else None,
    }
    tot, t0c = timeline["end_counts"], timeline["start_counts"]
    out["totals"] = {"runtime": timeline["t_end"] - timeline["t0"], "steps": end_step - timeline["start_step"],
                     **{f"rank_{k}": tot[k] - t0c[k] for k in tot}}
    return out


# -- the run ------------------------------------------------------------------------------------

def _device_info(local_rank: int) -> Any:
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    idx = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(idx)
    uuid = getattr(props, "uuid", None)
    return {"type": "cuda", "index": idx, "local_rank": local_rank, "name": props.name,
            "uuid": f"GPU-{uuid}" if uuid is not None and not str(uuid).startswith("GPU-") else (str(uuid) if uuid else None),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}


def resolve_settings(args: argparse.Namespace, ctx: Context) -> dict[str, Any]:
    """What this machine will actually run: CPU turns off bf16/fp16/flash-attention and uses float32."""
    import torch

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
    if str(args.training_data_path).endswith(".parquet"):
        raise TrainerSetupError(f"{args.training_data_path}: vision (image + text) datasets need a vision-language "
                                "model and processor; the sbench trainer trains text-only datasets (JSONL)")
    if args.packing:
        raise TrainerSetupError("--packing True is not supported: the reference experiments run with packing False")
    if not cuda:
        if args.bf16:
            ctx.note("bf16 turned off: no CUDA")
        if args.fp16:
            ctx.note("fp16 turned off: no CUDA")
        if args.torch_dtype not in ("float32", "float"):
            ctx.note(f"torch_dtype {args.torch_dtype} -> float32: no CUDA")
        if args.use_flash_attn:
            ctx.note("flash-attention turned off: no CUDA")
        s.update(torch_dtype="float32", bf16=False, fp16=False)
    elif args.use_flash_attn:
        try:
            import flash_attn  # noqa: F401

            s["attn_implementation"] = "flash_attention_2"
        except ImportError:
            ctx.note("flash-attention requested but the flash_attn package is not installed; using sdpa")
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
    from transformers import BitsAndBytesConfig

    return {"quantization_config": BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=dtype, bnb_4bit_quant_storage=dtype)}


def enable_cpu_fsdp(trainer: Any) -> bool:
    """Make FSDP from ``accelerate launch`` (``ACCELERATE_USE_FSDP``) take effect on CPU.

    accelerate's ``AcceleratorState`` turns FSDP on only when the distributed type is an
    accelerator one (MULTI_GPU, ...); on CPU the launcher's FSDP settings are silently dropped
    and the run becomes plain DDP over gloo. FSDP v2 (``fully_shard``) does run on CPU over
    gloo, so set the state to FSDP with the plugin accelerate built from the launcher's
    environment, and tell the Trainer (which read the state while it was MULTI_CPU).
    """
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

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


def run_totals(metrics: dict[str, Any], world_size: int, device: Any) -> None:
    """Add the run's samples and dataset tokens (all ranks, one all-reduce) to rank-local *metrics*.

    As in the reference (HF's ``train_samples_per_second`` counts every device's samples; note 3
    counts the run's dataset tokens), ``train_samples*`` and ``dataset_tokens*`` are run totals;
    ``train_tokens*`` stay this rank's (collect scales them by world size, the seeds' FSDP estimate).
    """
    import torch

    counts = [metrics["rank_train_samples"], metrics["rank_dataset_tokens"], metrics["train_tokens"]]
    if world_size > 1 and torch.distributed.is_initialized():
        t = torch.tensor(counts, dtype=torch.float64, device=device)
        torch.distributed.all_reduce(t)
        counts = [int(x) for x in t.tolist()]
    samples, dtok, ttok = counts
    rt = metrics["train_runtime"]
    metrics.update({
        "world_size": world_size,
        "train_samples": samples,
        "train_samples_per_second": samples / rt if rt > 0 else None,
        "dataset_tokens": dtok,
        "dataset_tokens_per_second": dtok / rt if rt > 0 else None,
        "dataset_tokens_per_second_per_gpu": dtok / rt / world_size if rt > 0 else None,
        "run_train_tokens": ttok,
    })


def _backend_name() -> str | None:
    import torch

    if not torch.distributed.is_initialized():
        return None
    try:
        return str(torch.distributed.get_backend_config())
    except Exception:  # noqa: BLE001 - older torch
        return str(torch.distributed.get_backend())


def _wrapping(trainer: Any) -> dict[str, Any]:
    """How the model was actually wrapped: proof that DDP/FSDP ran, not just that it was asked for."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover
        DTensor = ()
    wrapped = getattr(trainer, "model_wrapped", None) or trainer.model
    params = list(trainer.model.parameters())
    return {"wrapped_class": type(wrapped).__name__,
            "model_class": type(trainer.model).__name__,
            "sharded_parameters": sum(1 for p in params if isinstance(p, DTensor)),
            "parameters_tensors": len(params)}


def _peft_config(args: argparse.Namespace, tokenizer_path: str) -> Any:
    if args.peft_method == "lora":
        from peft import LoraConfig

        return LoraConfig(r=args.r, lora_alpha=args.lora_alpha, lora_dropout=args.lora_dropout,
                          target_modules=args.target_modules, task_type="CAUSAL_LM", bias="none")
    if args.peft_method == "pt":
        from peft import PromptTuningConfig

        kw: dict[str, Any] = {}
        if args.prompt_tuning_init == "TEXT":
            kw = {"prompt_tuning_init_text": args.prompt_tuning_init_text or "Continue the news story.",
                  "tokenizer_name_or_path": tokenizer_path}
        return PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=args.num_virtual_tokens,
                                  prompt_tuning_init=args.prompt_tuning_init, **kw)
    return None


def _lengths_and_empty(data: Any) -> tuple[list[int], int]:
    """Per-entry token counts and how many entries have no completion token, straight from Arrow."""
    import numpy as np

    lengths: list[int] = []
    empty = 0
    for chunk in data.data.table.column("completion_mask").chunks:
        rel = chunk.offsets.to_numpy()
        rel = rel - rel[0]
        n = np.diff(rel)
        lengths.extend(n.tolist())
        flat = chunk.flatten().to_numpy(zero_copy_only=False)
        starts = rel[:-1][n > 0]
        has = np.maximum.reduceat(flat, starts) > 0 if len(starts) else np.zeros(0, dtype=bool)
        empty += int((n == 0).sum()) + int((~has).sum())
    return lengths, empty


def launch_start(ctx: Context) -> None:
    """Open the rank's ``launch`` stage at the moment the node runner started the training command
    (``SBENCH_LAUNCHED_WALL``), else when this module started loading: launcher, imports and the
    rendezvous are start-up time like any other, and the stages should say where it went."""
    try:
        launched = float(envvars.LAUNCHED_WALL.get())
    except ValueError:
        launched = MODULE_START_WALL
    ctx.launch = {"launched_wall": min(launched, MODULE_START_WALL), "process_start_wall": MODULE_START_WALL}
    ctx.log.start(Stage.LAUNCH, at=ctx.launch["launched_wall"])


def launch_end(ctx: Context, imported_wall: float) -> None:
    if not ctx.launch:
        return
    now = time.time()
    born, launched = ctx.launch["process_start_wall"], ctx.launch["launched_wall"]
    ctx.log.end(Stage.LAUNCH, info={"launcher_s": round(max(0.0, born - launched), 3),
                                    "imports_s": round(imported_wall - born, 3),
                                    "rendezvous_s": round(now - imported_wall, 3)})
    ctx.launch = {}


def launch_failed(ctx: Context, status: str, error: str) -> None:
    """End a launch stage an exception escaped from (imports, settings, the process group)."""
    if ctx.launch:
        ctx.launch = {}
        ctx.log.last_failed = Stage.LAUNCH
        ctx.log.end(Stage.LAUNCH, status, error)


def run(args: argparse.Namespace, ctx: Context) -> dict[str, Any]:
    doc = ctx.doc
    settings = resolve_settings(args, ctx)  # before the heavy imports: a config that cannot run fails fast

    from accelerate import PartialState
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    doc["settings"] = {k: (str(v) if k == "dtype" else v) for k, v in settings.items()}
    doc["device"] = _device_info(ctx.local_rank)
    gc_kwargs = dict(args.gradient_checkpointing_kwargs or {})

    # Created first: everything below can then use the process group (gloo on CPU).
    t_imported = time.time()
    state = PartialState(cpu=not settings["cuda"])
    launch_end(ctx, t_imported)

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
            info["prepared"] = prep.summary()
            doc["prepared"] = prep.summary()
            if prep.status != "hit":
                note = (f"training data {prep.status} in the job ({prep.reason}; {prep.build_s or 0:.1f} s): it was "
                        "not prepared before the job started; run 'sbench prepare SWEEP' before submitting")
                ctx.note(note)
                info["note"] = note
        else:
            data = encode_for_training(tokenizer, args.training_data_path, text_field=args.dataset_text_field,
                                       max_seq_length=args.max_seq_length, response_template=args.response_template)
            info["prepared"], dataset_sha = None, None
        lengths, no_completion = _lengths_and_empty(data)
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

    with ctx.log.stage(Stage.MODEL_LOAD) as info:
        ctx.fault_at_stage(Stage.MODEL_LOAD)
        if ctx.world_size > 1:
            os.environ.setdefault("FSDP_USE_ORIG_PARAMS", str(args.fsdp_use_orig_params).lower())
        model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path, dtype=settings["dtype"],
                                                     attn_implementation=settings["attn_implementation"],
                                                     **qlora_kwargs(args, settings["dtype"]))
        meter = Meter()
        collator = CountingCollator(DataCollatorForLanguageModeling(pad_token_id=tokenizer.pad_token_id), meter)
        config = SFTConfig(
            output_dir=args.output_dir, per_device_train_batch_size=args.per_device_train_batch_size,
            gradient_accumulation_steps=args.gradient_accumulation_steps, num_train_epochs=args.num_train_epochs,
            max_steps=args.max_steps, learning_rate=args.learning_rate, weight_decay=args.weight_decay,
            warmup_steps=args.warmup_ratio, lr_scheduler_type=args.lr_scheduler_type,
            logging_strategy="steps", logging_steps=args.logging_steps, save_strategy="no", eval_strategy="no",
            report_to="none", optim=args.optim, optim_args=args.optim_args, bf16=settings["bf16"], fp16=settings["fp16"],
            use_cpu=not settings["cuda"], activation_checkpointing=args.gradient_checkpointing,
            activation_checkpointing_kwargs=gc_kwargs or None, max_length=args.max_seq_length, packing=False,
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

        trainer = BenchTrainer(model=model, args=config, train_dataset=data, processing_class=tokenizer,
                               data_collator=collator, peft_config=_peft_config(args, args.model_name_or_path),
                               callbacks=[_make_callback(ctx, meter, policy, timeline, memory)])
        acc = trainer.accelerator
        memory.engine_of = lambda: getattr(getattr(acc, "deepspeed_engine_wrapped", None), "engine", None)
        dist = {"distributed_type": str(acc.distributed_type).split(".")[-1], "num_processes": acc.num_processes,
                "backend": _backend_name(),
                "fsdp_version": getattr(getattr(acc.state, "fsdp_plugin", None), "fsdp_version", None),
                "requested": args.distributed_backend,
                "zero_stage": getattr(getattr(acc.state, "deepspeed_plugin", None), "zero_stage", None)}
        doc["distributed"] = dist
        params = sum(p.numel() for p in trainer.model.parameters())
        trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
        doc["model"] = {"source": args.model_name_or_path, "class": type(model).__name__, "parameters": params,
                        "trainable_parameters": trainable, "peft_method": args.peft_method}
        # What the FLOPs formula needs (harness.flops): collect turns it into model TFLOP/s and MFU.
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
        doc["distributed"].update(_wrapping(trainer))
        m["training_loss"] = out.training_loss
        m["meter"] = {"mismatches": meter.mismatches, "unconsumed_batches": len(meter.pending)}
        doc.update(m)
        policy.record(doc, args, ctx)
        info.update(global_step=m["global_step"], stopped_by=m["stopped_by"],
                    train_runtime=(m.get("metrics") or {}).get("train_runtime"))
        if ctx.rank == 0 and ctx.paths is not None:
            _write_json(ctx.paths.log_history, trainer.state.log_history)
    return doc


def _on_signal(signum: int, frame: Any) -> None:
    raise Terminated(signum)


def main(argv: list[str] | None = None, runner: Any = None) -> int:
    """Run one rank; *runner* (default :func:`run`) trains, everything around it (signals, the launch
    stage, error classification, ``rank.<r>.json``) is shared by both trainers."""
    args = parse_args(argv)
    ctx = Context.from_env(args)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _on_signal)
    doc = ctx.doc
    doc.update(rank=ctx.rank, local_rank=ctx.local_rank, world_size=ctx.world_size, host=ctx.host, trial=ctx.trial,
               pid=os.getpid(), status="running", env=relevant_env(), device=None, notes=ctx.notes,
               argv=sys.argv[1:] if argv is None else list(argv), started_wall=time.time())
    code = 0
    launch_start(ctx)
    try:
        (runner or run)(args, ctx)
        doc["status"] = "ok"
    except Terminated as exc:
        launch_failed(ctx, "killed", str(exc))
        doc["status"], doc["error"] = "killed", str(exc)
        code = 128 + exc.signum
    except BaseException as exc:  # noqa: BLE001 - every failure is classified and recorded
        launch_failed(ctx, "error", f"{type(exc).__name__}: {exc}"[:2000])
        rec = error_record(exc, rank=ctx.rank, host=ctx.host, stage=ctx.log.last_failed, trial=ctx.trial,
                           t_wall=time.time())
        doc["status"], doc["error"] = "error", {k: rec[k] for k in ("kind", "error_type", "message", "stage")}
        if ctx.paths is not None:
            _write_json(ctx.paths.error(ctx.rank), rec)
        traceback.print_exc()
        print(f"sbench[rank {ctx.rank}]: {rec['kind']}: {rec['error_type']}: {rec['message']}", file=sys.stderr,
              flush=True)
        code = 1
    doc["ended_wall"] = time.time()
    if ctx.paths is not None:
        _write_json(ctx.paths.rank_result(ctx.rank), doc)
    return code


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown (process-group and thread joins that can hang after a peer died).
    os._exit(code)
