"""The experiment catalog: entity spaces, defaults, domains and hardcoded values.

This is the *what* of a benchmark, transcribed from the reference experiments:
five experiments, the fields a point may set, what each defaults to, which
values are allowed, and the per-model LoRA ``target_modules``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.contract.defaults import AUTO_STOP  # noqa: F401 - re-exported
from harness.contract.errors import CatalogError, InputError
from harness.contract.formats import RESPONSE_TEMPLATE, TEXT_FIELD
from harness.contract.paths import VISION_PREFIX

from .modelmap import ModelMap
from .schema import INT_MAX, MAX_NUMBER, show, text_problem

BENCHMARK_MODELS = (
    "granite-3b-1.5", "hf-tiny-model-private/tiny-random-BloomForCausalLM", "llama-7b", "granite-13b-v2",
    "llama-13b", "granite-20b-v2", "granite-7b-base", "granite-8b-japanese", "granite-8b-code-base",
    "granite-34b-code-base", "mistral-7b-v0.1", "llama3-8b", "llama3-70b", "mixtral-8x7b-instruct-v0.1",
    "llama2-70b", "llama3.1-8b", "llama3.1-70b", "llama3.1-405b", "granite-3b-code-base-128k",
    "granite-8b-code-base-128k", "allam-1-13b", "granite-3-8b", "granite-3.1-2b", "granite-3.1-8b-instruct",
    "mistral-123b-v2", "granite-3.1-3b-a800m-instruct", "granite-vision-3.2-2b", "smollm2-135m",
    "llava-v1.6-mistral-7b", "granite-4.0-micro", "granite-4.0-h-1b", "granite-4.0-350m", "granite-4.0-h-small",
    "granite-4.0-h-micro", "granite-4.0-h-tiny", "granite-3.3-8b",
)
GPTQ_MODELS = (
    "llama-7b", "granite-20b-v2", "granite-7b-base", "granite-8b-code-instruct", "granite-34b-code-base",
    "mistral-7b-v0.1", "llama3-70b", "mixtral-8x7b-instruct-v0.1", "llama3.1-405b",
)

_QV, _QK, _CA = ("q_proj", "v_proj"), ("q_proj", "k_proj"), ("c_attn", "c_proj")
LORA_TARGET_MODULES: dict[str, tuple[str, ...]] = {
    "llama3.2-1b": _QV, "llama3.2-3b": _QV, "smollm2-135m": _QV, "granite-3.0-1b-a400m-base": _QV,
    "granite-3.1-3b-a800m-instruct": _QV, "granite-vision-3.2-2b": _QV, "granite-3b-code-base-128k": _QV,
    "granite-7b-base": _QV, "granite-8b-code-base-128k": _QV, "granite-8b-code-base": _QV,
    "granite-8b-japanese": _QV, "granite-13b-v2": _CA, "granite-20b-v2": _CA, "granite-34b-code-base": _CA,
    "llama-7b": _QK, "llama-13b": _QK, "llama2-70b": _QV, "llama3-8b": _QK, "llama3-70b": _QV,
    "llama3.1-8b": _QV, "llama3.1-70b": _QV, "llama3.1-405b": _QV, "granite-4.0-micro": _QV,
    "granite-4.0-h-1b": _QV, "granite-4.0-350m": _QV, "granite-4.0-h-small": _QV, "granite-4.0-h-micro": _QV,
    "granite-4.0-h-tiny": _QV, "allam-1-13b": _QV,
    "hf-tiny-model-private/tiny-random-BloomForCausalLM": ("dense_h_to_4h", "dense_4h_to_4h"),
    "mistral-7b-v0.1": _QV, "mistral-123b-v2": _QV, "mixtral-8x7b-instruct-v0.1": _QV, "granite-3-8b": _QV,
    "granite-3.3-8b": _QV, "granite-3.1-2b": _QV, "granite-3.1-8b-instruct": _QV, "llava-v1.6-mistral-7b": _QV,
}
GPTQ_TARGET_MODULES: dict[str, tuple[str, ...]] = {
    "granite-8b-code-instruct": _QV, "granite-7b-base": _QV, "granite-20b-v2": _CA, "granite-34b-code-base": _CA,
    "llama-7b": _QK, "llama3-70b": _QV, "mistral-7b-v0.1": _QV, "mixtral-8x7b-instruct-v0.1": _QV,
    "llama3.1-405b": _QV, "allam-1-13b": _QV,
}
DEFAULT_TARGET_MODULES = _QV

TEXT_DATASETS = (
    "news-chars-512-entries-4096",
    "news-chars-1024-entries-4096",
    "news-chars-2048-entries-4096",
    "news-tokens-16384plus-entries-4096",
    "news-tokens-128kplus-entries-320",
)
# A vision dataset id: vision-<width>x<height>-<N>plus-entries-<entries> (harness.data.datagen generates them)
VISION_ID_RE = re.compile(r"vision-(\d+)x(\d+)-(\d+)plus-entries-(\d+)")
VISION_DATASETS = ("vision-384x384-16384plus-entries-4096", "vision-384x768-16384plus-entries-4096")
BENCHMARK_DATASETS = TEXT_DATASETS[:4] + VISION_DATASETS
DATASET_IDS = TEXT_DATASETS + VISION_DATASETS

FMS_VERSIONS = ("3.1.0", "3.0.0.1", "3.0.0", "2.8.2", "2.7.1", "2.6.0", "2.5.0", "2.4.0", "2.3.1", "2.2.1",
                "2.1.2", "2.1.0", "2.0.1")
OPTIMIZERS = (
    "adamw_hf", "adamw_torch", "adamw_torch_fused", "adamw_torch_xla", "adamw_torch_npu_fused", "adamw_apex_fused",
    "adafactor", "adamw_anyprecision", "adamw_torch_4bit", "ademamix", "sgd", "adagrad", "adamw_bnb_8bit",
    "adamw_8bit", "ademamix_8bit", "lion_8bit", "lion_32bit", "paged_adamw_32bit", "paged_adamw_8bit",
    "paged_ademamix_32bit", "paged_ademamix_8bit", "paged_lion_32bit", "paged_lion_8bit", "rmsprop", "rmsprop_bnb",
    "rmsprop_bnb_8bit", "rmsprop_bnb_32bit", "galore_adamw", "galore_adamw_8bit", "galore_adafactor",
    "galore_adamw_layerwise", "galore_adamw_8bit_layerwise", "galore_adafactor_layerwise", "lomo", "adalomo",
    "grokadamw", "schedule_free_adamw", "schedule_free_sgd",
)
# What an optimizer needs beyond torch: (python package, needs CUDA). The sbench trainer passes optim to
# transformers' Trainer, which imports these packages when it builds the optimizer.
_BNB = ("bitsandbytes", True)
OPTIMIZER_NEEDS: dict[str, tuple[str, bool]] = {
    **{o: _BNB for o in OPTIMIZERS if "bnb" in o or "8bit" in o or o.startswith("paged_")
       or o in ("ademamix", "lion_32bit")},
    "adamw_torch_xla": ("torch_xla", False), "adamw_torch_npu_fused": ("torch_npu", False),
    "adamw_anyprecision": ("torchdistx", False), "adamw_torch_4bit": ("torchao", False),
    **{o: ("galore_torch", False) for o in OPTIMIZERS if o.startswith("galore_")},
    "lomo": ("lomo_optim", False), "adalomo": ("lomo_optim", False), "grokadamw": ("grokadamw", False),
    "schedule_free_adamw": ("schedulefree", False), "schedule_free_sgd": ("schedulefree", False),
}
_OPTIM_ARG = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=[A-Za-z0-9_.+\-]+")


def optim_args(text: str) -> dict[str, str]:
    """transformers' ``optim_args`` ("momentum=0.9,nesterov=true") as a dict; ValueError names a bad pair."""
    out = {}
    for pair in str(text).replace(" ", "").split(","):
        if not _OPTIM_ARG.fullmatch(pair):
            raise ValueError(f"{pair!r} is not key=value (give pairs like momentum=0.9 separated by commas)")
        key, value = pair.split("=", 1)
        out[key] = value
    return out


TRAINERS = ("sbench", "fms-hf-tuning")


# Other spellings of a torch dtype (torch.float is float32, ...).
DTYPE_ALIASES = {"float": "float32", "half": "float16", "double": "float64", "bf16": "bfloat16", "fp16": "float16",
                 "fp32": "float32"}


def dtype_name(value: Any) -> str:
    """A torch dtype's one name: ``torch.float``, ``"float"`` and ``"float32"`` are all ``"float32"``."""
    text = str(value).removeprefix("torch.")
    return DTYPE_ALIASES.get(text, text)
_RELEASE = re.compile(r"[0-9]{1,4}(\.[0-9]{1,4}){1,3}")


def fms_version(text: str) -> str:
    """An fms-hf-tuning release as pip names it (3.2.2, 3.0.0.1): digits and dots, nothing else."""
    if not _RELEASE.fullmatch(str(text)):
        raise ValueError(f"{text!r} is not a release number like 3.2.2 (the reference's: {', '.join(FMS_VERSIONS)})")
    return str(text)


# Reference optimizer names transformers 5 no longer has (its Trainer rejects them).
OPTIMIZERS_GONE = {"adamw_hf": "adamw_torch", "adamw_apex_fused": "adamw_torch_fused"}
SHARDING = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")
STATE_DICT = ("FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT")
# Bounds of entity values: beyond them a value is a typo, never a benchmark.
MAX_GPUS = 1 << 16
MAX_NODES = 1 << 12
MAX_BATCH = 1 << 24
MAX_SEQ_LEN = 1 << 24

# Properties each benchmark measures, under the reference names (collect's columns).
BENCHMARK_PROPERTIES = (
    "gpu_compute_utilization_min", "gpu_compute_utilization_avg", "gpu_compute_utilization_max",
    "gpu_memory_utilization_min", "gpu_memory_utilization_avg", "gpu_memory_utilization_max",
    "gpu_power_percent_min", "gpu_power_percent_avg", "gpu_power_percent_max",
    "gpu_power_watts_min", "gpu_power_watts_avg", "gpu_power_watts_max",
    "gpu_memory_utilization_peak", "cpu_compute_utilization", "cpu_memory_utilization",
    "train_runtime", "train_samples_per_second", "train_steps_per_second", "train_tokens_per_second",
    "train_tokens_per_gpu_per_second", "dataset_tokens_per_second", "dataset_tokens_per_second_per_gpu",
    "is_valid",
)
STABILITY_PROPERTIES = ("f_gpu_oom", "f_other_error", "f_no_error", "is_valid")
# What sbench measures beyond the reference's properties (collect's columns, after those above):
#   train_tokens_per_second_exact   every rank's counted train tokens / rank 0's train_runtime (the
#                                   reference's figure is world size x rank 0's rate);
#   cpu_compute_utilization_rank0   rank 0's own process CPU time / its measured window, in percent
#                                   (cpu_compute_utilization is the node's whole process tree);
#   peak_tflops .. mfu              harness.spec.flops: the peak used, model FLOPs per token, achieved model
#                                   and hardware TFLOP/s per device, MFU.
DERIVED_PROPERTIES = ("train_tokens_per_second_exact", "cpu_compute_utilization_rank0", "peak_tflops",
                      "model_flops_per_token", "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu")
# Every numeric measurement a sweep's references may name (harness.references).
METRICS = tuple(dict.fromkeys([p for p in BENCHMARK_PROPERTIES + STABILITY_PROPERTIES if p != "is_valid"]
                              + list(DERIVED_PROPERTIES)))


@dataclass(frozen=True)
class FieldSpec:
    """One entity-space field: its type, default, domain and meaning."""

    name: str
    kind: str  # int | float | bool | str | list
    help: str
    default: Any = None
    required: bool = False
    domain: tuple[Any, ...] | None = None
    nullable: bool = False
    minimum: float | None = None
    maximum: float | None = None  # default: INT_MAX for int, MAX_NUMBER for float
    max_len: int = 256  # characters of a str value (or of each item of a list)
    # A field added after the first release: left out of the point id while it has its default, so the
    # points measured before it existed keep their ids (and stay comparable across campaigns).
    id_omit_default: bool = False
    parse: Callable[[Any], Any] | None = None  # a further check of the value: ValueError says what is wrong

    def coerce(self, value: Any, where: str) -> Any:
        """Check *value* against the field; return it in canonical form or raise ``InputError``."""
        if value is None or (isinstance(value, str) and value == "None" and self.nullable):
            if self.nullable or (self.default is None and not self.required):
                return None
            hint = f" ({self.help})" if self.required else ""
            raise InputError(f"{where}: {self.name} must not be null; give {_kind_text(self.kind)}{hint}")
        kind = self.kind
        bad = f"{where}: {self.name} must be {_kind_text(kind)}, got {show(value)}"
        if kind == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                if isinstance(value, float) and math.isfinite(value) and value.is_integer() and abs(value) < 2**63:
                    value = int(value)
                else:
                    raise InputError(bad)
        elif kind == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise InputError(bad)
            if isinstance(value, int) and abs(value) > 2**63:
                raise InputError(f"{where}: {self.name} must be a number <= {_num(self.upper)}, got {show(value)}")
            value = float(value)
            if not math.isfinite(value):
                raise InputError(f"{where}: {self.name} must be a finite number, got {value!r}")
        elif kind == "bool":
            if isinstance(value, str) and value.lower() in ("true", "false"):
                value = value.lower() == "true"
            if not isinstance(value, bool):
                raise InputError(bad)
        elif kind == "str":
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                raise InputError(bad)
            if isinstance(value, float) and not math.isfinite(value):
                raise InputError(bad)
            value = self._text(str(value), where)
        elif kind == "list":
            if isinstance(value, str):
                value = value.split()
            if not isinstance(value, (list, tuple)) or len(value) > 64 or not all(
                    isinstance(v, (str, int, bool)) for v in value):
                raise InputError(bad)
            value = [self._text(str(v), where) for v in value]
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if self.minimum is not None and value < self.minimum:
                raise InputError(f"{where}: {self.name} must be >= {_num(self.minimum)}, got {show(value)}")
            if value > self.upper or value < -self.upper:
                raise InputError(f"{where}: {self.name} must be <= {_num(self.upper)}, got {show(value)}")
        if self.domain is not None and value not in self.domain:
            shown = ", ".join(str(d) for d in self.domain)
            raise InputError(f"{where}: {self.name} must be one of: {shown}; got {value!r}")
        if self.parse is not None:
            try:
                self.parse(value)
            except ValueError as exc:
                raise InputError(f"{where}: {self.name}: {exc}") from None
        return value

    @property
    def upper(self) -> float:
        if self.maximum is not None:
            return self.maximum
        return INT_MAX if self.kind == "int" else MAX_NUMBER

    def _text(self, text: str, where: str) -> str:
        problem = text_problem(text, self.max_len)
        if problem:
            raise InputError(f"{where}: {self.name} {problem}")
        return text

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.kind, "required": self.required, "default": self.default,
                "domain": list(self.domain) if self.domain is not None else None, "nullable": self.nullable,
                "help": self.help}


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _kind_text(kind: str) -> str:
    return {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string",
            "list": "a list"}[kind]


def _f(name: str, kind: str, help: str, default: Any = None, **kw: Any) -> FieldSpec:
    return FieldSpec(name=name, kind=kind, help=help, default=default, **kw)


def _core_required(models: tuple[str, ...]) -> list[FieldSpec]:
    return [
        _f("model_name", "str", "Model name (see the model map)", required=True, domain=None),
        _f("model_max_length", "int", "Maximum sequence length; sequences are right padded and truncated",
           required=True, minimum=1, maximum=MAX_SEQ_LEN),
        _f("number_gpus", "int", "Effective number of GPUs, spread evenly over number_nodes", required=True,
           minimum=0, maximum=MAX_GPUS),
        _f("batch_size", "int", "Effective batch size, spread evenly over max(1, number_gpus) devices",
           required=True, maximum=MAX_BATCH),
        _f("gpu_model", "str", "GPU product (e.g. NVIDIA-A100-SXM4-80GB); defaults to the partition's",
           required=True),
    ]


def _benchmark_optional(dtype_domain: tuple[str, ...], dtype_default: str) -> list[FieldSpec]:
    return [
        _f("dataset_id", "str", "Synthetic dataset id", "news-tokens-16384plus-entries-4096",
           domain=BENCHMARK_DATASETS),
        _f("gradient_checkpointing", "bool", "Use gradient checkpointing", True),
        _f("gradient_accumulation_steps", "int", "Update steps to accumulate before a backward/update pass", 4,
           minimum=1, maximum=MAX_BATCH),
        _f("torch_dtype", "str", "dtype the weights are loaded in", dtype_default, domain=dtype_domain),
        _f("max_steps", "int", "Optimisation steps; -1 to respect num_train_epochs", -1, minimum=-1),
        _f("num_train_epochs", "float", "Epochs; ignored when max_steps > 0", 1.0, minimum=0, maximum=1e6),
        _f("stop_after_seconds", "float", "Ask the optimiser to stop after this many seconds (checked after each "
           "step); -1 = off", -1.0, minimum=-1, maximum=1e9),
        _f("auto_stop_method", "str", f"None or {AUTO_STOP}", None, domain=(None, AUTO_STOP), nullable=True),
        _f("distributed_backend", "str", "FSDP (default for multi-GPU), DDP or DEEPSPEED (ZeRO, also on one "
           "device); None for single-device runs", None, domain=(None, "FSDP", "DDP", "DEEPSPEED"), nullable=True),
        _f("number_nodes", "int", "Machines to spread number_gpus over, one process per GPU", 1,
           maximum=MAX_NODES),
        _f("trainer", "str", "Which trainer runs the point: sbench (trl/transformers 5 in sbench's environment) or "
           "fms-hf-tuning (the reference's tuning.sft_trainer, in an environment of its own per release)", "sbench",
           domain=TRAINERS, id_omit_default=True),
        _f("fms_hf_tuning_version", "str", "fms-hf-tuning release the fms-hf-tuning trainer runs (its environment is "
           "built once per release); recorded only, with the sbench trainer", "2.1.2", max_len=20, parse=fms_version),
        _f("enable_roce", "bool", "RDMA over Converged Ethernet for multi-node runs", False),
        _f("fast_moe", "int", "Expert-parallel degree; number_gpus must be divisible by it (0 = off)", 0,
           minimum=0, maximum=MAX_GPUS),
        _f("fast_kernels", "list", "[fast_loss, fast_rms_layernorm, fast_rope_embeddings]", None, nullable=True),
        _f("optim", "str", "Optimizer", "adamw_torch", domain=OPTIMIZERS),
        _f("optim_args", "str", "The optimizer's extra arguments as transformers takes them, key=value pairs "
           "separated by commas, e.g. momentum=0.9 for sgd", None, nullable=True, max_len=200,
           id_omit_default=True, parse=optim_args),
        _f("bf16", "bool", "bf16 mixed precision", False),
        _f("gradient_checkpointing_use_reentrant", "bool", "Reentrant activation checkpointing", False),
        _f("fsdp_sharding_strategy", "str", "FSDP sharding strategy", "FULL_SHARD", domain=SHARDING),
        _f("fsdp_state_dict_type", "str", "FSDP state dict type", "FULL_STATE_DICT", domain=STATE_DICT),
        _f("fsdp_use_orig_params", "bool", "FSDP use_orig_params", True),
        _f("fsdp_offload_params", "bool", "FSDP CPU offload: parameters, gradients and optimizer state live in "
           "host memory between uses (needs FSDP over GPUs)", False, id_omit_default=True),
        _f("deepspeed_zero_stage", "int", "DeepSpeed ZeRO stage: 1 shards optimizer state, 2 also gradients, "
           "3 also parameters (distributed_backend DEEPSPEED)", 2, domain=(1, 2, 3), id_omit_default=True),
        _f("deepspeed_offload_optimizer", "bool", "DeepSpeed ZeRO-Offload: optimizer state, fp32 master weights "
           "and the optimizer step on the host CPU (DEEPSPEED)", False, id_omit_default=True),
        _f("deepspeed_offload_params", "bool", "DeepSpeed ZeRO-Infinity parameter offload to host memory "
           "(DEEPSPEED with deepspeed_zero_stage 3)", False, id_omit_default=True),
        _f("use_qlora", "bool", "QLoRA: the frozen base weights of the targeted linear layers load in 4-bit NF4 "
           "(bitsandbytes, CUDA only; LoRA experiments)", False, id_omit_default=True),
        _f("accelerate_config_mixed_precision", "str", "accelerate mixed_precision", "no",
           domain=("no", "fp16", "bf16", "fp8")),
        _f("accelerate_config_fsdp_transformer_layer_cls_to_wrap", "str",
           "Transformer layer class(es) for FSDP auto-wrap, e.g. LlamaDecoderLayer", None, nullable=True),
        _f("dataset_text_field", "str", "Text column of the dataset", None, nullable=True),
        _f("dataset_image_field", "str", "Image column of a vision dataset", None, nullable=True),
        _f("remove_unused_columns", "bool", "Remove dataset columns the model does not use", True),
        _f("dataset_kwargs_skip_prepare_dataset", "bool", "Skip trl's dataset preparation", False),
    ]


LORA_FIELDS = [
    _f("r", "int", "LoRA rank", 4, minimum=1, maximum=1 << 16),
    _f("lora_alpha", "int", "LoRA alpha", 16, minimum=1, maximum=1 << 20),
]


@dataclass(frozen=True)
class Experiment:
    id: str
    method: str  # full | lora | pt | gptq-lora
    summary: str
    fields: tuple[FieldSpec, ...]
    models: tuple[str, ...]
    hardcoded: Mapping[str, Any] = field(default_factory=dict)
    properties: tuple[str, ...] = BENCHMARK_PROPERTIES
    trials: int = 1
    multi_node: bool = True
    requires_cuda: bool = False

    def field(self, name: str) -> FieldSpec | None:
        for f in self.fields:
            if f.name == name:
                return f
        return None

    @property
    def field_names(self) -> list[str]:
        return [f.name for f in self.fields]

    def target_modules(self, model_name: str, model_map: ModelMap | None = None) -> tuple[str, ...]:
        if model_map is not None and model_map.target_modules(model_name):
            return model_map.target_modules(model_name)  # type: ignore[return-value]
        table = GPTQ_TARGET_MODULES if self.method == "gptq-lora" else LORA_TARGET_MODULES
        return table.get(model_name, DEFAULT_TARGET_MODULES)

    def asked_settings(self, entity: Mapping[str, Any]) -> dict[str, Any]:
        """What the point's reference command line asks of the trainer, before any partition or environment
        changes it: ``torch_dtype``, ``bf16``, ``fp16`` and ``attn_implementation``. The runner records what
        it used beside it (``rank.<r>.json``: ``ran``, ``adjustments``)."""
        hc = self.hardcoded
        return {"torch_dtype": str(hc.get("torch_dtype", entity.get("torch_dtype", "bfloat16"))),
                "bf16": bool(hc.get("bf16", entity.get("bf16", False))), "fp16": bool(hc.get("fp16", False)),
                "attn_implementation": "flash_attention_2" if hc.get("use_flash_attn") else "sdpa"}

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "method": self.method, "summary": self.summary,
            "required": [f.to_dict() for f in self.fields if f.required],
            "optional": [f.to_dict() for f in self.fields if not f.required],
            "hardcoded": dict(self.hardcoded), "models": list(self.models),
            "measured_properties": list(self.properties), "trials": self.trials,
            "multi_node": self.multi_node, "requires_cuda": self.requires_cuda,
            "target_modules": ({m: list(t) for m, t in (GPTQ_TARGET_MODULES if self.method == "gptq-lora"
                                                        else LORA_TARGET_MODULES).items()}
                               if self.method in ("lora", "gptq-lora") else None),
        }


_COMMON_HARDCODED = {
    "use_flash_attn": True, "packing": False, "save_strategy": "no", "learning_rate": 1e-5, "weight_decay": 0.0,
    "warmup_ratio": 0.03, "lr_scheduler_type": "cosine", "logging_steps": 1, "include_tokens_per_second": True,
    "response_template": RESPONSE_TEMPLATE, "dataset_text_field": TEXT_FIELD, "cpus_per_device": 2,
    "min_cpus": 2,
}

EXPERIMENTS: dict[str, Experiment] = {}


def _add(exp: Experiment) -> None:
    EXPERIMENTS[exp.id] = exp


_add(Experiment(
    id="finetune_full_benchmark-v1.0.0", method="full",
    summary="Full fine-tuning; throughput, GPU/CPU utilisation and memory",
    fields=tuple(_core_required(BENCHMARK_MODELS)
                 + _benchmark_optional(("bfloat16", "float32", "float16"), "bfloat16")),
    models=BENCHMARK_MODELS, hardcoded={**_COMMON_HARDCODED, "peft_method": "none"},
))
_add(Experiment(
    id="finetune_lora_benchmark-v1.0.0", method="lora",
    summary="LoRA fine-tuning (per-model target_modules); throughput, utilisation and memory",
    fields=tuple(_core_required(BENCHMARK_MODELS) + _benchmark_optional(("bfloat16", "float32", "float16"), "bfloat16")
                 + LORA_FIELDS),
    models=BENCHMARK_MODELS, hardcoded={**_COMMON_HARDCODED, "peft_method": "lora"},
))
_add(Experiment(
    id="finetune_pt_benchmark-v1.0.0", method="pt",
    summary="Prompt tuning; throughput, utilisation and memory",
    fields=tuple(_core_required(BENCHMARK_MODELS)
                 + _benchmark_optional(("bfloat16", "float32", "float16"), "bfloat16")),
    models=BENCHMARK_MODELS,
    hardcoded={**_COMMON_HARDCODED, "peft_method": "pt", "num_virtual_tokens": 20,
               "prompt_tuning_init": "RANDOM"},
))
_add(Experiment(
    id="finetune_gtpq-lora_benchmark-v1.0.0", method="gptq-lora",
    summary="LoRA on GPTQ-quantised weights (CUDA only, float16)",
    fields=tuple(_core_required(GPTQ_MODELS) + _benchmark_optional(("float16",), "float16") + LORA_FIELDS),
    models=GPTQ_MODELS, requires_cuda=True,
    hardcoded={**_COMMON_HARDCODED, "peft_method": "lora", "auto_gptq": "triton_v2",
               "fast_kernels": ["True", "True", "True"], "fused_lora": ["auto_gptq", "True"], "fp16": True,
               "torch_dtype": "float16"},
))
_add(Experiment(
    id="finetune_full_stability-v1.0.0", method="full",
    summary="Full fine-tuning 5 times for 5 steps; fractions that ran out of GPU memory, failed, or completed",
    fields=(
        _f("model_name", "str", "Model name (see the model map)", required=True),
        _f("dataset_id", "str", "Synthetic dataset id", required=True, domain=DATASET_IDS),
        _f("number_gpus", "int", "GPUs (0 or more; single node only)", required=True, minimum=0,
           maximum=MAX_GPUS),
        _f("model_max_length", "int", "Maximum sequence length", required=True, minimum=1, maximum=MAX_SEQ_LEN),
        _f("torch_dtype", "str", "Any torch dtype name", required=True,
           domain=("bfloat16", "float16", "float32", "float64", "half", "float", "double")),
        _f("batch_size", "int", "Effective batch size", required=True, maximum=MAX_BATCH),
        _f("gpu_model", "str", "GPU product; defaults to the partition's", required=True),
        _f("gradient_accumulation_steps", "int", "Defaults to 4", 4, minimum=1, maximum=MAX_BATCH),
        _f("number_nodes", "int", "Always 1: the stability experiment is single-node", 1, maximum=MAX_NODES),
        _f("fast_moe", "int", "Expert-parallel degree (0 = off)", 0, minimum=0, maximum=MAX_GPUS),
    ),
    models=BENCHMARK_MODELS, properties=STABILITY_PROPERTIES, trials=5, multi_node=False,
    hardcoded={**_COMMON_HARDCODED, "peft_method": "none", "max_steps": 5, "distributed_backend": "FSDP",
               "fsdp_sharding_strategy": "FULL_SHARD", "fsdp_state_dict_type": "FULL_STATE_DICT",
               "accelerate_config_mixed_precision": "no", "optim": "adamw_torch", "bf16": False,
               "gradient_checkpointing": True, "gradient_checkpointing_use_reentrant": False, "trials": 5},
))


# The reference spells its GPTQ experiment "gtpq"; the spelling users type reaches it too.
EXPERIMENT_ALIASES = {"finetune_gptq-lora_benchmark-v1.0.0": "finetune_gtpq-lora_benchmark-v1.0.0"}


def get_experiment(exp_id: str) -> Experiment:
    exp_id = EXPERIMENT_ALIASES.get(exp_id, exp_id)
    if exp_id in EXPERIMENTS:
        return EXPERIMENTS[exp_id]
    raise CatalogError(f"unknown experiment {exp_id!r}; known experiments: {', '.join(EXPERIMENTS)}")


def is_vision_dataset(dataset_id: Any) -> bool:
    """A vision (image + text) dataset id: the catalogue's two, or any id of the generator's vision grammar."""
    return str(dataset_id or "") in VISION_DATASETS or str(dataset_id or "").startswith(VISION_PREFIX)
