"""FLOPs per token, peaks and MFU, checked against independent counts.

The independent side never calls harness.flops: parameters are counted from the safetensors file
on disk, the sequence length and throughput are read from rank.0.json, and the formula is written
out here from its definition (6·N + 12·L·d_attn·T for full fine-tuning).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.spec.flops import compute_dtype, flops_per_token, model_counts, peak_tflops
from harness.spec.memory import flop_counts

from .kit import TRAINED_PEAK_TFLOPS, TRAINED_PRICE, Trained, sql_rows, write_yaml
from .kit.models import on_disk_params


def test_peaks_come_from_the_table_or_the_inventory() -> None:
    assert peak_tflops("NVIDIA-A100-SXM4-80GB", "bf16") == (312.0, "gpu_peaks.yaml")
    assert peak_tflops("nvidia-h100-80gb-hbm3", "bf16") == (989.4, "gpu_peaks.yaml")
    assert peak_tflops("NVIDIA-A100-SXM4-80GB", "bf16", 250) == (250.0, "inventory")
    assert peak_tflops("cpu", "fp32", {"fp32": 0.5}) == (0.5, "inventory")
    assert peak_tflops("cpu", "fp32") == (None, "unknown")
    assert peak_tflops("Tesla-V100-SXM2-32GB", "bf16") == (None, "unknown")  # V100 has no bf16
    assert compute_dtype({"torch_dtype": "bfloat16"}, cpu=False) == "bf16"
    assert compute_dtype({"torch_dtype": "float32", "fp16": True}, cpu=False) == "fp16"
    assert compute_dtype({"torch_dtype": "bfloat16"}, cpu=True) == "fp32"


@pytest.mark.parametrize("value,needle", [("fast", "peak_tflops must be a number"), (-1, "peak_tflops must be"),
                                          ({"int8": 5}, "peak_tflops.int8 is not a known key")])
def test_a_bad_peak_is_an_input_error(cli, tmp_path: Path, value, needle) -> None:
    inv = write_yaml(tmp_path / "inv.yaml", {"cluster": "c", "partitions": {"cpu": {
        "gpu_model": "cpu", "gpus_per_node": 1, "cpus_per_node": 2, "memory_gb": 4, "peak_tflops": value,
        "hosts": {"h1": {}}}}})
    res = cli("inventory", "check", "-i", inv)
    assert res.exit_code == 2 and needle in res.output, res.output


def test_counts_match_the_checkpoint_for_full_lora_and_prompt_tuning(tiny_model: Path) -> None:
    import torch
    from peft import LoraConfig, PromptTuningConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    disk = on_disk_params(tiny_model)
    emb = next(v for k, v in disk.items() if k.endswith("embed_tokens.weight"))
    matmul = sum(disk.values()) - emb  # the untied lm_head multiplies; the input table is a lookup
    cfg = AutoConfig.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    c = model_counts(model, cfg)
    assert c["matmul_params"] == matmul and c["trainable_matmul_params"] == matmul
    assert c["layers"] == cfg.num_hidden_layers and c["attn_dim"] == cfg.hidden_size
    lora = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model),
                          LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    adapters = sum(p.numel() for n, p in lora.named_parameters() if "lora_" in n)
    cl = model_counts(lora, cfg)
    assert cl["trainable_matmul_params"] == adapters and cl["matmul_params"] == matmul + adapters
    pt = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model),
                        PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=8))
    cp = model_counts(pt, cfg)
    assert cp["matmul_params"] == matmul and cp["trainable_matmul_params"] == 0
    # the formula, written out: full 6N, frozen base 4N (+ adapters), plus 12 L d T
    T = 100.0
    attn = 12 * cfg.num_hidden_layers * cfg.hidden_size * T
    assert flops_per_token(c, T) == (6 * matmul + attn, 6 * matmul + attn)
    assert flops_per_token(c, T, recompute=True)[1] == 6 * matmul + attn + 2 * matmul + attn / 3
    assert flops_per_token(cl, T)[0] == 4 * (matmul + adapters) + 2 * adapters + attn
    # the plan's counts, from the architecture alone (no model loaded), are the loaded models' counts
    arch = json.loads((tiny_model / "config.json").read_text())
    assert flop_counts(arch, "full") == {k: c[k] for k in flop_counts(arch, "full") or {}}
    assert flop_counts(arch, "lora", r=4, target_modules=("q_proj", "v_proj")) == \
        {k: cl[k] for k in flop_counts(arch, "full") or {}}
    assert flop_counts(arch, "pt", num_virtual_tokens=8) == {k: cp[k] for k in flop_counts(arch, "full") or {}}
    assert flop_counts({"model_type": "unknown"}, "full") is None and flop_counts(None, "full") is None


@pytest.mark.train
def test_mfu_of_a_real_run_equals_an_independent_recomputation(trained: Trained, tiny_model: Path) -> None:
    """The session's trained campaigns declare a peak of 0.05 TFLOP/s per CPU worker process in the inventory;
    the batch-2 run of full fine-tuning is recomputed here from the checkpoint and the run's own counts."""
    peak = TRAINED_PEAK_TFLOPS
    (m,) = sql_rows(trained.db, "SELECT m.*, r.job_dir FROM measurements m JOIN runs r USING (run_id) "
                                "WHERE r.campaign = 'nightly-1' AND m.batch_size = 2")
    rank0 = json.loads((Path(m["job_dir"]) / "rank.0.json").read_text())
    spec = json.loads((Path(m["job_dir"]) / "spec.json").read_text())["jobspec"]
    assert spec["peak_tflops"] == peak and spec["peak_source"] == "inventory" and spec["compute_dtype"] == "fp32"
    cfg = json.loads((tiny_model / "config.json").read_text())
    disk = on_disk_params(tiny_model)
    n = sum(disk.values()) - next(v for k, v in disk.items() if k.endswith("embed_tokens.weight"))
    met = rank0["metrics"]
    T = met["train_tokens"] / met["rank_train_samples"]
    f = 6 * n + 12 * cfg["num_hidden_layers"] * cfg["hidden_size"] * T
    tflops = f * met["train_tokens_per_second"] / 1e12
    assert m["peak_tflops"] == peak
    assert m["model_tflops_per_gpu"] == pytest.approx(tflops, rel=1e-9)
    assert m["mfu"] == pytest.approx(tflops / peak, rel=1e-9) and 0 < m["mfu"] < 1
    # what a million dataset tokens cost: the inventory's price of a worker process an hour, every process paid
    assert spec["price_per_gpu_hour"] == m["price_per_gpu_hour"] == TRAINED_PRICE
    assert m["world_size"] == rank0["world_size"]  # every worker process is paid for
    assert m["cost_per_million_tokens"] == pytest.approx(
        TRAINED_PRICE * m["world_size"] * 1e6 / m["dataset_tokens_per_second"] / 3600, rel=1e-12)
    # gradient checkpointing (the experiment's default) recomputes one forward: hardware > model
    assert m["hardware_tflops_per_gpu"] == pytest.approx(
        (f + 2 * n + 4 * cfg["num_hidden_layers"] * cfg["hidden_size"] * T) * met["train_tokens_per_second"] / 1e12,
        rel=1e-9)
