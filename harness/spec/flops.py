"""Training FLOPs per token, peak throughput per GPU, and MFU.

**Model FLOPs per token** (what MFU counts; the standard dense-transformer estimate of Kaplan et
al. 2020 and of PaLM, Chowdhery et al. 2022, appendix B, with its attention term):

    F = 2·N  (forward)  +  2·N  (backward, activation gradients)  +  2·N_t  (backward, weight gradients)
        + 12 · L · d_attn · T  (attention scores and values: 2·T·d_attn each, forward, backward x2)

- ``N``: parameters taking part in a matrix multiply per token: every parameter except the input
  embedding table (a lookup). An untied output projection counts; a tied one counts once.
- ``N_t``: those of them that are trained (all for full fine-tuning; the adapters for LoRA; none
  for prompt tuning, whose virtual-token embedding is a lookup). So full fine-tuning gives the
  familiar ``6·N``; a frozen base costs ``4·N``.
- ``L`` layers, ``d_attn`` = attention heads x head dimension, ``T`` the sequence length the
  step actually ran (padded tokens / samples of the measured window). Causal masking is not
  subtracted, as in PaLM.

**Hardware FLOPs** add what gradient checkpointing recomputes: one more forward, ``2·N + 4·L·d_attn·T``.

``model_tflops_per_gpu`` = F x tokens / s per GPU (padded tokens: the compute performed) / 1e12;
``mfu`` = that / the GPU's peak dense TFLOP/s for the compute dtype (``harness/spec/gpu_peaks.yaml``,
or the inventory partition's ``peak_tflops``).
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Any

import yaml

DTYPES = ("bf16", "fp16", "tf32", "fp32")


@lru_cache(maxsize=1)
def peak_table() -> dict[str, dict[str, float]]:
    text = resources.files("harness.spec").joinpath("gpu_peaks.yaml").read_text(encoding="utf-8")
    return {str(k): {str(d): float(v) for d, v in vals.items()} for k, vals in yaml.safe_load(text).items()}


def compute_dtype(entity: dict[str, Any], cpu: bool) -> str:
    """The dtype matrix multiplies run in: what the run's peak is read for."""
    if cpu:
        return "fp32"  # the trainer loads float32 and turns mixed precision off without CUDA
    dtype = str(entity.get("torch_dtype") or "").lower()
    if entity.get("bf16") or dtype in ("bfloat16", "bf16"):
        return "bf16"
    if entity.get("fp16") or dtype in ("float16", "fp16", "half"):
        return "fp16"
    return "fp32"


def peak_tflops(gpu_model: str, dtype: str, override: Any = None) -> tuple[float | None, str]:
    """``(peak, source)`` for one GPU: the inventory's override first, then the table; None if unknown."""
    if isinstance(override, (int, float)) and not isinstance(override, bool):
        return float(override), "inventory"
    if isinstance(override, dict) and override.get(dtype) is not None:
        return float(override[dtype]), "inventory"
    table = peak_table()
    row = table.get(gpu_model) or {k.lower(): v for k, v in table.items()}.get(gpu_model.lower())
    if row and row.get(dtype) is not None:
        return row[dtype], "gpu_peaks.yaml"
    return None, "unknown"


def model_counts(model: Any, config: Any) -> dict[str, Any]:
    """What the FLOPs formula needs, counted on the loaded (possibly PEFT-wrapped) model."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    emb = base.get_input_embeddings() if hasattr(base, "get_input_embeddings") else None
    emb_ids = {id(p) for p in emb.parameters()} if emb is not None else set()
    out_emb = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    tied = out_emb is not None and emb is not None and out_emb.weight is emb.weight
    seen: set[int] = set()
    matmul = trainable = 0
    for name, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        lookup = id(p) in emb_ids and not tied  # a tied table is also the output projection: it multiplies
        if lookup or "prompt_encoder" in name:  # prompt tuning's virtual tokens are a lookup too
            continue
        matmul += p.numel()
        if p.requires_grad:
            trainable += p.numel()
    cfg = getattr(config, "text_config", None) or config
    heads = getattr(cfg, "num_attention_heads", None)
    head_dim = getattr(cfg, "head_dim", None) or (cfg.hidden_size // heads if heads else None)
    return {"matmul_params": int(matmul), "trainable_matmul_params": int(trainable),
            "layers": getattr(cfg, "num_hidden_layers", None), "attention_heads": heads, "head_dim": head_dim,
            "attn_dim": heads * head_dim if heads and head_dim else None}


def flops_per_token(counts: dict[str, Any], seq_len: float, recompute: bool = False) -> tuple[float, float] | None:
    """``(model, hardware)`` training FLOPs per token (see the module doc); None without the counts."""
    n, nt = counts.get("matmul_params"), counts.get("trainable_matmul_params")
    layers, d = counts.get("layers"), counts.get("attn_dim")
    if not n or nt is None or not layers or not d or not seq_len:
        return None
    attn = 12.0 * layers * d * seq_len
    model = 4.0 * n + 2.0 * nt + attn
    hardware = model + (2.0 * n + attn / 3.0 if recompute else 0.0)
    return model, hardware


def run_flops(rank0: dict[str, Any] | None, peak: float | None) -> dict[str, float | None]:
    """The measurement columns of one run from rank 0's ``flops`` counts and ``metrics``."""
    out: dict[str, float | None] = {"peak_tflops": peak, "model_flops_per_token": None,
                                    "model_tflops_per_gpu": None, "hardware_tflops_per_gpu": None, "mfu": None}
    doc = rank0 or {}
    counts, m = doc.get("flops") or {}, doc.get("metrics") or {}
    samples, tokens, tps = m.get("rank_train_samples"), m.get("train_tokens"), m.get("train_tokens_per_second")
    if not counts or not samples or not tokens or not isinstance(tps, (int, float)):
        return out
    f = flops_per_token(counts, tokens / samples, bool(counts.get("gradient_checkpointing")))
    if f is None:
        return out
    model_tflops = f[0] * tps / 1e12
    out["model_flops_per_token"] = f[0]
    out["model_tflops_per_gpu"] = model_tflops
    out["hardware_tflops_per_gpu"] = f[1] * tps / 1e12
    if peak:
        out["mfu"] = model_tflops / peak
    return out
