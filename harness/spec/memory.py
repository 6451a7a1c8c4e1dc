"""Predicted memory of one device for a point, before anything is submitted (``sbench plan --memory``).

From the model's config.json (read where the weights are, else the architecture facts sbench ships for
a catalogue model, ``model_configs.yaml``, so that a point is predicted before anything is downloaded),
per device (one GPU, or one worker process on a CPU partition):

- **parameters**, counted per tensor group by the architecture's formula (Llama, Mistral, Qwen2/3,
  Granite, Mixtral and GraniteMoE: embeddings, attention projections with their biases, the gated MLP or the
  experts and their router, the norms, and the LM head unless it is tied), at the dtype the trainer
  really uses (a CPU partition trains in float32, whatever torch_dtype says);
- **trainable parameters**: every one for full fine-tuning; LoRA's ``r x (in + out)`` per targeted
  linear layer (the catalog's target modules for the model); prompt tuning's
  ``num_virtual_tokens x hidden``. PEFT keeps adapter weights in float32 (4 bytes);
- **gradients**: one per trainable parameter, in its dtype;
- **optimizer state**, per optimizer: AdamW and its fused/apex/anyprecision forms two tensors like
  the parameter; AdEMAMix three; 8-bit Adam 2 bytes (plus one fp32 scale per 2,048 values per
  state); Lion 1 tensor; Adagrad and RMSprop one; SGD none, or one momentum buffer with
  ``optim_args: momentum=...``; Adafactor a
  row and a column factor per matrix. HF's Trainer keeps no separate fp32 master copy: under
  ``bf16`` autocast the parameters stay in the loaded dtype;
- **sharding**: FSDP ``FULL_SHARD`` divides parameters, gradients and optimizer state by the number
  of devices, ``SHARD_GRAD_OP`` gradients and state only, the ``HYBRID_*`` forms by the devices of
  one node; DDP (and ``NO_SHARD``) replicate everything. With ``fsdp_offload_params`` they live in
  host memory, and the device holds the largest wrapped unit (a decoder layer, or the embedding or
  LM head) while it computes;
- **DeepSpeed ZeRO** (``distributed_backend: DEEPSPEED``): stage 1 partitions the optimizer state
  over the ranks, stage 2 also the gradients, stage 3 also the parameters, tensor by tensor (each
  padded to a multiple of the ranks; a tensor under ZeRO-3's persistence threshold also stays
  whole on every rank). ZeRO always steps an fp32 master copy of its partition of the trainable
  parameters, counted as optimizer state (the ZeRO paper's accounting). Offloaded state and
  parameters are counted in ``host``, not in the device total;
- **QLoRA** (``use_qlora``): the linear layers' weights in NF4 with double-quantised scales
  (:data:`QLORA_BYTES_PER_WEIGHT`), the adapters in bf16;
- **activations**, an estimate (Korthikanti et al., "Reducing Activation Recomputation in Large
  Transformer Models", 2022, eq. 2, without tensor or sequence parallelism): per layer
  ``s·b·h·(34 + 5·a·s/h)`` bytes at 2-byte activations, where the ``5·a·s/h`` term (attention
  scores) is dropped for SDPA/flash attention, which do not store them; scaled by the activation
  dtype's size / 2. With gradient checkpointing only each layer's input (``2·s·b·h`` bytes at 2-byte)
  is kept, plus one layer's full activations while it is recomputed. Plus the fp32 logits and their
  gradient, ``2 · 4·s·b·V``. ``s`` is model_max_length, ``b`` the per-device batch.

A point is ``predicted_oom`` when that total plus a fixed reserve (CUDA context and allocator slack,
:data:`RESERVE_GB`) exceeds the device's memory: the partition's ``gpu_memory_gb``, else
``harness/spec/gpu_memory.yaml`` for its gpu_model; on a CPU partition the node's memory_gb shared
by its worker processes. The parameter, gradient and optimizer figures are exact for the supported
architectures (tests compare them with counts of the instantiated model and a real optimizer step);
the activation figure is an estimate.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from harness.contract.defaults import DEEPSPEED_BUCKET, ZERO3_PERSISTENCE

from .catalog import VISION_ID_RE, optim_args
from .inventory import BYTES_PER_GB
from .modelconfig import CATALOGUE_CONFIG, architecture, is_vision_config
from .resources import point_counts

RESERVE_GB = 1.0
# bitsandbytes NF4 with double quantisation: 4 bits per weight, one 8-bit scale per 64-weight block and
# one fp32 scale per 256 such blocks
QLORA_BYTES_PER_WEIGHT = 0.5 + 1 / 64 + 4 / (64 * 256)
GB = BYTES_PER_GB  # the inventory's GB (memory_gb, gpu_memory_gb, gpu_memory.yaml)
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "float64": 8, "double": 8}
# model_type -> (q/k/v bias, o bias) defaults; attention_bias in the config overrides both
_SUPPORTED = {"llama": (False, False), "mistral": (False, False), "granite": (False, False),
              "qwen2": (True, False), "qwen3": (False, False), "mixtral": (False, False),
              "granitemoe": (False, False)}
_MOE = ("mixtral", "granitemoe")  # experts of one MLP shape each, and a router
# optimizer -> (bytes per trainable value: {"like": tensors like the parameter} or fixed bytes)
_OPT_LIKE = {"adamw_hf": 2, "adamw_torch": 2, "adamw_torch_fused": 2, "adamw_torch_xla": 2,
             "adamw_torch_npu_fused": 2, "adamw_apex_fused": 2, "adamw_anyprecision": 2, "ademamix": 3,
             "adagrad": 1, "rmsprop": 1, "sgd": 0, "lion_32bit": 1, "paged_lion_32bit": 1}
_OPT_FIXED = {"adamw_bnb_8bit": 2, "adamw_8bit": 2, "paged_adamw_8bit": 2, "ademamix_8bit": 3, "lion_8bit": 1,
              "paged_lion_8bit": 1, "paged_adamw_32bit": 8, "paged_ademamix_32bit": 12, "paged_ademamix_8bit": 3,
              "adamw_torch_4bit": 1, "rmsprop_bnb": 1}
_BNB_BLOCK = 2048  # bitsandbytes' blockwise quantisation: one fp32 absmax per block per state


@dataclass(frozen=True)
class Shape:
    model_type: str
    vocab: int
    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool
    experts: int = 0
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False

    def linears(self) -> list[tuple[str, int, int, int]]:
        """(module name, in features, out features, how many in the model) of every linear layer but
        the LM head."""
        d, hd, L = self.hidden, self.head_dim, self.layers
        out = [("q_proj", d, self.heads * hd, L), ("k_proj", d, self.kv_heads * hd, L),
               ("v_proj", d, self.kv_heads * hd, L), ("o_proj", self.heads * hd, d, L)]
        if self.experts:
            out += [("gate", d, self.experts, L), ("w1", d, self.intermediate, L * self.experts),
                    ("w3", d, self.intermediate, L * self.experts), ("w2", self.intermediate, d, L * self.experts)]
        else:
            out += [("gate_proj", d, self.intermediate, L), ("up_proj", d, self.intermediate, L),
                    ("down_proj", self.intermediate, d, L)]
        return out


class Unsupported(ValueError):
    """No parameter formula for this config: the memory is not predicted (with this reason)."""


def shape_of(cfg: dict[str, Any]) -> Shape:
    mt = str(cfg.get("model_type") or "")
    if mt not in _SUPPORTED:
        raise Unsupported(f"model_type {mt or '?'!r} has no parameter formula (supported: {', '.join(_SUPPORTED)})")
    try:
        d, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        qkv_bias, o_bias = _SUPPORTED[mt]
        if "attention_bias" in cfg and mt != "qwen2":
            qkv_bias = o_bias = bool(cfg["attention_bias"])
        return Shape(model_type=mt, vocab=int(cfg["vocab_size"]), hidden=d, layers=int(cfg["num_hidden_layers"]),
                     intermediate=int(cfg["intermediate_size"]), heads=heads,
                     kv_heads=int(cfg.get("num_key_value_heads") or heads),
                     head_dim=int(cfg.get("head_dim") or d // heads),
                     tied=bool(cfg.get("tie_word_embeddings", False)),
                     experts=int(cfg.get("num_local_experts") or 0) if mt in _MOE else 0,
                     qkv_bias=qkv_bias, o_bias=o_bias, mlp_bias=bool(cfg.get("mlp_bias", False)),
                     qk_norm=mt == "qwen3")
    except (KeyError, TypeError, ValueError) as exc:
        raise Unsupported(f"config.json lacks or mangles {exc}") from None


def parameter_groups(s: Shape) -> dict[str, int]:
    """Parameters per tensor group (exact for the supported architectures)."""
    d, L = s.hidden, s.layers
    attn = sum(i * o * n for name, i, o, n in s.linears() if name in ("q_proj", "k_proj", "v_proj", "o_proj"))
    if s.qkv_bias:
        attn += L * (s.heads + 2 * s.kv_heads) * s.head_dim
    if s.o_bias:
        attn += L * d
    mlp = sum(i * o * n for name, i, o, n in s.linears() if name not in ("q_proj", "k_proj", "v_proj", "o_proj"))
    if s.mlp_bias and not s.experts:
        mlp += L * (2 * s.intermediate + d)
    norms = L * 2 * d + d + (L * 2 * s.head_dim if s.qk_norm else 0)
    return {"embedding": s.vocab * d, "attention": attn, "mlp": mlp, "norms": norms,
            "lm_head": 0 if s.tied else s.vocab * d}


def tensor_sizes(s: Shape) -> list[tuple[int, int]]:
    """(elements, how many) of every parameter tensor of the model: what ZeRO-3 partitions one by one."""
    d, L, hd = s.hidden, s.layers, s.head_dim
    out = [(s.vocab * d, 1 if s.tied else 2), (d, 2 * L + 1)]
    out += [(i * o, n) for _, i, o, n in s.linears()]
    if s.qkv_bias:
        out += [(s.heads * hd, L), (s.kv_heads * hd, 2 * L)]
    if s.o_bias:
        out.append((d, L))
    if s.mlp_bias and not s.experts:
        out += [(s.intermediate, 2 * L), (d, L)]
    if s.qk_norm:
        out.append((hd, 2 * L))
    return out


def largest_unit(s: Shape) -> int:
    """Parameters of the largest unit an offloading engine brings to the device at once: one decoder
    layer, or the embedding (or an untied LM head)."""
    g = parameter_groups(s)
    layer = (g["attention"] + g["mlp"] + g["norms"] - s.hidden) // max(1, s.layers)  # the final norm is no layer's
    return max(layer, g["embedding"], g["lm_head"])


def adapter_sizes(s: Shape, method: str, *, r: int = 4, target_modules: tuple[str, ...] = (),
                  num_virtual_tokens: int = 20) -> list[tuple[int, int]]:
    """(elements, how many) of the trainable adapter tensors: LoRA's A (r x in) and B (out x r) per
    targeted layer, prompt tuning's embedding."""
    if method in ("lora", "gptq-lora"):
        wanted = set(target_modules)
        return [x for name, i, o, n in s.linears() if name in wanted for x in ((r * i, n), (o * r, n))]
    if method == "pt":
        return [(num_virtual_tokens * s.hidden, 1)]
    return []


def _zero(entity: dict[str, Any], s: Shape, method: str, sizes: list[tuple[int, int]],
          adapters: list[tuple[int, int]], trainable: int, vb: int, tb: int, devices: int,
          opt: int | None, notes: list[str]) -> tuple[int, int, int, dict[str, int]]:
    """(param, grad, optimizer bytes on the device, bytes offloaded to the host) per rank under
    DeepSpeed ZeRO: stage 1 partitions the optimizer state (and keeps only its partition of the
    reduced gradients), 2 also the gradients, 3 also the parameters (tensor by tensor, each padded to a
    multiple of the ranks; one of fewer than :data:`ZERO3_PERSISTENCE` elements also stays whole). ZeRO
    always steps an fp32 master copy of the trainable parameters' partition, counted with the optimizer
    state."""
    stage = int(entity.get("deepspeed_zero_stage") or 2)
    n = max(1, devices)
    part = -(-trainable // n)
    master = 4 * part
    state = (opt or 0) // n  # *opt* is the state of fp32 values: the optimizer steps the fp32 partitions
    if stage == 3:
        def shard(elems: int, count: int, size: int) -> int:  # one rank's partition is the tensor itself
            return count * size * (-(-elems // n) + (elems if elems < ZERO3_PERSISTENCE and n > 1 else 0))
        params = sum(shard(e, c, vb) for e, c in sizes) + sum(shard(e, c, tb) for e, c in adapters)
    else:
        params = sum(e * c for e, c in sizes) * vb + sum(e * c for e, c in adapters) * tb
    # After backward every stage keeps its partition of the reduced gradients (ZeRO-1 holds the full
    # gradient only while backward runs, until the reduction at the accumulation boundary).
    grads = tb * part
    host: dict[str, int] = {}
    optimizer = master + state
    if entity.get("deepspeed_offload_optimizer"):
        host["optimizer_bytes"] = optimizer
        host["grad_bytes"] = 4 * part  # the fp32 gradient partition the host optimizer steps
        optimizer = 0
        if stage < 3:
            grads = 0  # stage 1/2 reduce straight into the host's fp32 partition (through the buckets)
        notes.append("deepspeed_offload_optimizer: optimizer state, fp32 master weights and their fp32 gradient "
                     "partition counted in host memory")
    if entity.get("deepspeed_offload_params") and stage == 3:
        host["param_bytes"] = params
        params = largest_unit(s) * vb
        notes.append("deepspeed_offload_params: parameter partitions counted in host memory; the device holds the "
                     "largest gathered unit while it computes")
    notes.append(f"DeepSpeed ZeRO-{stage} over {n} rank(s); communication buckets (reduce_bucket_size, "
                 f"allgather_bucket_size: {DEEPSPEED_BUCKET:.0e} elements each) not counted")
    if adapters and stage == 3:
        notes.append("ZeRO-3 partitions the frozen base weights too")
    return params, grads, optimizer, host


def trainable_parameters(s: Shape, method: str, *, r: int = 4, target_modules: tuple[str, ...] = (),
                         num_virtual_tokens: int = 20) -> int:
    if method in ("lora", "gptq-lora"):
        wanted = set(target_modules)
        return sum(r * (i + o) * n for name, i, o, n in s.linears() if name in wanted)
    if method == "pt":
        return num_virtual_tokens * s.hidden
    return sum(parameter_groups(s).values())


def flop_counts(cfg: dict[str, Any] | None, method: str, *, r: int = 4, target_modules: tuple[str, ...] = (),
                num_virtual_tokens: int = 20) -> dict[str, Any] | None:
    """What :func:`harness.spec.flops.flops_per_token` needs, from the architecture alone (no model loaded):
    the counts :func:`harness.spec.flops.model_counts` takes from a loaded one. Every parameter multiplies but the
    untied input embedding (a lookup); LoRA's adapters multiply and are the trained ones; prompt tuning's virtual
    tokens are a lookup. None where the architecture has no parameter formula."""
    if cfg is None:
        return None
    try:
        tower = vision_tower_of(cfg) if is_vision_config(cfg) else None
        s = shape_of(cfg["text_config"] if tower is not None else cfg)
    except (Unsupported, KeyError, TypeError, ValueError):
        return None
    groups = parameter_groups(s)
    base = sum(groups.values()) - (0 if s.tied else groups["embedding"])
    if tower is not None:
        base += tower.params + tower.projector + tower.newline
    trained = trainable_parameters(s, method, r=r, target_modules=target_modules, num_virtual_tokens=num_virtual_tokens)
    if method in ("lora", "gptq-lora"):
        matmul, trained_matmul = base + trained, trained
    elif method == "pt":
        matmul, trained_matmul = base, 0
    else:
        matmul, trained_matmul = base, base
    return {"matmul_params": matmul, "trainable_matmul_params": trained_matmul, "layers": s.layers,
            "attention_heads": s.heads, "head_dim": s.head_dim, "attn_dim": s.heads * s.head_dim}


def optimizer_bytes(optim: str, trainable: int, value_bytes: int, s: Shape | None = None,
                    method: str = "full", args: str | None = None) -> int | None:
    """Optimizer state bytes for *trainable* values of *value_bytes* each; None when unknown. *args*:
    the point's optim_args (SGD with a non-zero momentum keeps one momentum buffer)."""
    if optim == "sgd" and args:
        try:
            momentum = float(optim_args(args).get("momentum", 0))
        except ValueError:
            momentum = 0.0
        return trainable * value_bytes if momentum else 0
    if optim in _OPT_LIKE:
        return _OPT_LIKE[optim] * trainable * value_bytes
    if optim in _OPT_FIXED:
        n = _OPT_FIXED[optim] * trainable
        if "8bit" in optim or optim == "rmsprop_bnb":
            states = 1 if ("lion" in optim or optim == "rmsprop_bnb") else (3 if "ademamix" in optim else 2)
            n += states * 4 * -(-trainable // _BNB_BLOCK)
        return n
    if optim == "adafactor" and s is not None and method == "full":
        # factored second moment: a row and a column vector per matrix, full for vectors (fp32)
        mats = sum((i + o) * n for _, i, o, n in s.linears()) + (s.vocab + s.hidden) * (1 if s.tied else 2)
        vectors = trainable - sum(i * o * n for _, i, o, n in s.linears()) - s.vocab * s.hidden * (1 if s.tied else 2)
        return 4 * (mats + max(0, vectors))
    return None


@dataclass
class MemoryPrediction:
    status: str  # ok | unknown
    reason: str | None = None
    parameters: int | None = None  # count, whole model
    trainable: int | None = None
    param_bytes: int | None = None  # per device, after sharding
    grad_bytes: int | None = None
    optimizer_bytes: int | None = None
    activation_bytes: int | None = None
    total_bytes: int | None = None
    device_bytes: int | None = None
    device_source: str | None = None
    predicted_oom: bool | None = None
    groups: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    host: dict[str, int] = field(default_factory=dict)  # per rank, offloaded to host memory (not in total)
    config_source: str | None = None  # where the architecture came from: a config.json, or sbench's catalogue

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def total_gb(self) -> float | None:
        return None if self.total_bytes is None else self.total_bytes / GB


# Vision towers sbench has a parameter formula for (a ViT encoder: patch embedding, positions, pre-norm layers)
_VISION_TOWERS = ("siglip_vision_model", "clip_vision_model")


@dataclass(frozen=True)
class VisionTower:
    """A vision-language model's image side: the ViT tower, the projector into the language model, the image
    newline (LLaVA-NeXT)."""

    model_type: str
    hidden: int
    intermediate: int
    layers: int
    patches: int  # patches of one tile (the tower's tokens per tile, without a class token)
    params: int
    projector: int
    newline: int


def vision_tower_of(cfg: dict[str, Any]) -> VisionTower:
    """The image side of a LLaVA / LLaVA-NeXT config (``vision_config`` a SigLIP or CLIP vision tower, a
    2-layer MLP projector). Exact for these: a test counts the instantiated tiny model's parameters."""
    vc = cfg.get("vision_config") or {}
    text = cfg.get("text_config") or {}
    mt = str(vc.get("model_type") or "")
    if mt not in _VISION_TOWERS:
        raise Unsupported(f"vision tower {mt or '?'!r} has no parameter formula (supported: "
                          f"{', '.join(_VISION_TOWERS)})")
    try:
        h, i, L = int(vc["hidden_size"]), int(vc["intermediate_size"]), int(vc["num_hidden_layers"])
        image, patch = int(vc["image_size"]), int(vc["patch_size"])
        channels = int(vc.get("num_channels") or 3)
        th = int(text["hidden_size"])
    except (KeyError, TypeError, ValueError) as exc:
        raise Unsupported(f"vision_config lacks or mangles {exc}") from None
    patches = (image // patch) ** 2
    clip = mt == "clip_vision_model"
    layer = 4 * (h * h + h) + (h * i + i) + (i * h + h) + 4 * h  # q, k, v, out; fc1, fc2; two layer norms
    params = channels * patch * patch * h + (0 if clip else h)  # patch embedding (CLIP's has no bias)
    params += (patches + (1 if clip else 0)) * h + (h + 2 * h if clip else 0)  # positions; class token, pre-norm
    params += L * layer + 2 * h  # layers, post layer norm
    if not clip and vc.get("vision_use_head", True):  # SigLIP's attention-pooling head
        params += (3 * h * h + 3 * h) + (h * h + h) + h + 2 * h + (h * i + i) + (i * h + h)
    feature_layers = cfg.get("vision_feature_layer", -2)
    n_feat = len(feature_layers) if isinstance(feature_layers, list) else 1
    bias = 1 if cfg.get("multimodal_projector_bias", True) else 0
    projector = (h * n_feat * th + bias * th) + (th * th + bias * th)
    newline = th if str(cfg.get("model_type")) == "llava_next" else 0
    return VisionTower(mt, h, i, L, patches, params, projector, newline)


def vision_tokens(dataset_id: Any, model_max_length: int) -> int | None:
    """The tokens of one entry of a vision dataset, as the model sees them (the entries are not truncated):
    at least the dataset id's ``<N>plus`` tokens, nearly all of them image tokens."""
    m = VISION_ID_RE.fullmatch(str(dataset_id or ""))
    return max(model_max_length, int(m[3])) if m else None


@lru_cache(maxsize=256)
def config_for(model_name: str, source: str | None) -> tuple[dict[str, Any] | None, str | None]:
    """(architecture, where it comes from) of a model, once per name and source: its config.json when
    readable here, else sbench's catalogue facts (``modelconfig.architecture``)."""
    return architecture(model_name, source)


@lru_cache(maxsize=1)
def gpu_memory_table() -> dict[str, float]:
    doc = yaml.safe_load((Path(__file__).parent / "gpu_memory.yaml").read_text()) or {}
    return {str(k): float(v) for k, v in doc.items()}


def device_memory(partition: Any, processes_per_node: int) -> tuple[float | None, str]:
    """(bytes of one device, where that figure comes from)."""
    if getattr(partition, "gpu_memory_gb", None):
        return float(partition.gpu_memory_gb) * GB, "inventory gpu_memory_gb"
    if partition.is_cpu:
        return partition.memory_gb * GB * 0.95 / max(1, processes_per_node), "node memory_gb / processes"
    gb = gpu_memory_table().get(partition.gpu_model)
    return (gb * GB, "gpu_memory.yaml") if gb else (None, f"unknown: no memory known for {partition.gpu_model}; "
                                                          "set gpu_memory_gb on the partition")


def _shards(entity: dict[str, Any], devices: int, per_node: int) -> tuple[int, int]:
    """(divisor of parameters, divisor of gradients and optimizer state)."""
    if devices <= 1 or str(entity.get("distributed_backend") or "").upper() != "FSDP":
        return 1, 1
    strategy = str(entity.get("fsdp_sharding_strategy") or "FULL_SHARD")
    group = per_node if strategy.startswith("HYBRID") else devices
    if strategy in ("FULL_SHARD", "HYBRID_SHARD"):
        return group, group
    if strategy in ("SHARD_GRAD_OP", "HYBRID_SHARD_ZERO2"):
        return 1, group
    return 1, 1


def predict(entity: dict[str, Any], method: str, cfg: dict[str, Any] | None, partition: Any, *,
            target_modules: tuple[str, ...] = (), num_virtual_tokens: int = 20,
            attention: str = "sdpa", config_source: str | None = None) -> MemoryPrediction:
    """The per-device memory of one point (see the module docstring). *config_source* says where *cfg*
    came from (a config.json, or :data:`modelconfig.CATALOGUE_CONFIG`)."""
    if cfg is None:
        return MemoryPrediction("unknown", f"the config.json of {entity.get('model_name') or 'the model'} is not "
                                           "readable here and sbench ships no architecture facts for it (run sbench "
                                           "prepare or sbench model fetch first, or map it to a local copy)")
    tower = None
    try:
        if is_vision_config(cfg):
            if not isinstance(cfg.get("text_config"), dict) or not isinstance(cfg.get("vision_config"), dict):
                raise Unsupported(f"vision-language model_type {cfg.get('model_type') or '?'!r}: its text_config and "
                                  "vision_config are not known here (sbench's catalogue holds only its model_type; "
                                  "map the model to a local copy, e.g. after sbench model fetch, for a prediction)")
            tower = vision_tower_of(cfg)
            s = shape_of(cfg["text_config"])
        else:
            s = shape_of(cfg)
    except Unsupported as exc:
        return MemoryPrediction("unknown", str(exc), config_source=config_source)
    counts = point_counts(entity)
    devices, per_node = counts.processes, counts.processes_per_node  # each process holds one device's share
    cpu = partition.is_cpu
    dtype = "float32" if cpu else str(entity.get("torch_dtype") or "bfloat16")
    vb = DTYPE_BYTES.get(dtype, 2)
    groups = parameter_groups(s)
    notes = []
    if tower is not None:
        groups.update(vision_tower=tower.params, projector=tower.projector + tower.newline)
        if method in ("lora", "gptq-lora"):
            notes.append("vision-language model: LoRA adapters on the language model only; the vision tower and "
                         "projector frozen")
    total_params = sum(groups.values())
    trainable = trainable_parameters(s, method, r=int(entity.get("r") or 4), target_modules=target_modules,
                                     num_virtual_tokens=num_virtual_tokens)
    adapter = method in ("lora", "gptq-lora", "pt")
    if tower is not None and method == "full":
        trainable = total_params
    tb = 4 if adapter else vb  # PEFT keeps adapters in float32
    p_div, g_div = _shards(entity, devices, per_node)
    base_bytes = total_params * vb
    if entity.get("use_qlora") and method == "lora" and not cpu:
        # QLoRA: every linear layer but the LM head in NF4 (half a byte per weight, plus the double-quantised
        # block scales); the adapters in bf16, as trl casts them for a quantised model.
        quantised = sum(i * o * n for _, i, o, n in s.linears())
        base_bytes = int(quantised * QLORA_BYTES_PER_WEIGHT) + (total_params - quantised) * vb
        tb = 2
        notes.append(f"use_qlora: {quantised:,} linear weights at {QLORA_BYTES_PER_WEIGHT:.4f} bytes (NF4 + double-"
                     "quantised scales), adapters in bf16; an estimate no CPU run can check")
    param_bytes = (base_bytes + (trainable * tb if adapter else 0)) // p_div
    grad_bytes = trainable * tb // g_div
    opt = optimizer_bytes(str(entity.get("optim") or "adamw_torch"), trainable, tb, s, method,
                          entity.get("optim_args"))
    if opt is None:
        notes.append(f"optimizer {entity.get('optim')}: state size unknown, counted as 0")
    opt_bytes = (opt or 0) // g_div
    host: dict[str, int] = {}
    if str(entity.get("distributed_backend") or "").upper() == "DEEPSPEED":
        cast = not cpu and bool(entity.get("bf16"))  # the DeepSpeed engine casts the whole module to bf16
        ds_vb = 2 if cast else vb
        param_bytes, grad_bytes, opt_bytes, host = _zero(
            entity, s, method, tensor_sizes(s),
            adapter_sizes(s, method, r=int(entity.get("r") or 4), target_modules=target_modules,
                          num_virtual_tokens=num_virtual_tokens),
            trainable, ds_vb, ds_vb if cast or not adapter else 4, devices,
            optimizer_bytes(str(entity.get("optim") or "adamw_torch"), trainable, 4, s, method,
                            entity.get("optim_args")), notes)
    elif entity.get("fsdp_offload_params") and not cpu and p_div > 1:
        # CPU offload: the shards, their gradients and the optimizer state live in host memory; the device
        # holds one wrapped layer's full parameters (and their gradients) while it computes.
        biggest = largest_unit(s)
        param_bytes, grad_bytes, opt_bytes = biggest * vb, biggest * tb if not adapter else 0, 0
        notes.append("fsdp_offload_params: parameters, gradients and optimizer state counted in host memory; "
                     "the device holds the largest wrapped unit while it computes")
    b = max(1, int(entity.get("batch_size") or 1) // devices)
    seq = int(entity.get("model_max_length") or 1024)
    act_b = 2 if (not cpu and (entity.get("bf16") or dtype in ("bfloat16", "float16"))) else vb
    scores = 0 if attention in ("sdpa", "flash_attention_2") else 5 * s.heads * seq / s.hidden
    layer = seq * b * s.hidden * (34 + scores) * act_b / 2
    if entity.get("gradient_checkpointing"):
        acts = s.layers * 2 * seq * b * s.hidden * act_b / 2 + layer
    else:
        acts = s.layers * layer
    acts += 2 * 4 * seq * b * s.vocab
    if tower is not None:
        # The image tokens are in the language model's sequence: a vision entry is not truncated, so the
        # sequence is the entry's length (the dataset id's <N>plus tokens) where it exceeds model_max_length.
        # The tower runs on every tile of every image: about as many patch tokens as the entry has image
        # tokens (anyres adds one newline per row, the base tile one tile's), at its own width.
        entry = vision_tokens(entity.get("dataset_id"), seq)
        if entry is not None and entry > seq:
            notes.append(f"vision dataset: sequences of {entry:,} tokens (its entries are not truncated to "
                         f"model_max_length {seq}), nearly all of them image tokens")
            ratio = entry / seq
            acts *= ratio
            seq = entry
        vlayer = seq * b * tower.hidden * 34 * act_b / 2
        acts += (tower.layers * 2 * seq * b * tower.hidden * act_b / 2 + vlayer
                 if entity.get("gradient_checkpointing") else tower.layers * vlayer)
    if min(total_params, trainable, param_bytes, grad_bytes, opt_bytes, acts) < 0:  # never a negative "fit"
        return MemoryPrediction("unknown", "the model config or the point gives a negative size; nothing predicted")
    total = param_bytes + grad_bytes + opt_bytes + int(acts)
    dev, src = device_memory(partition, per_node)
    if config_source == CATALOGUE_CONFIG:
        notes.append(f"architecture of {entity.get('model_name')} from {CATALOGUE_CONFIG}: its config.json is not "
                     "readable here")
    pred = MemoryPrediction("ok", None, total_params, trainable, param_bytes, grad_bytes, opt_bytes, int(acts), total,
                            None if dev is None else int(dev), src, None, groups, notes, host, config_source)
    if dev is not None:
        pred.predicted_oom = total + RESERVE_GB * GB * (0 if cpu else 1) > dev
    return pred
