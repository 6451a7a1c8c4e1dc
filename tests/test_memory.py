"""The memory prediction (harness.memory) against independent counts: the instantiated model's tensors,
PEFT's adapters, and the gradients and optimizer state of a real training step."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.spec.memory import (
    DTYPE_BYTES,
    optimizer_bytes,
    parameter_groups,
    predict,
    shape_of,
    trainable_parameters,
)

from . import kit
from .kit import ROOT, sbench, write_yaml

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

CONFIGS = {
    "llama": dict(model_type="llama", vocab_size=320, hidden_size=64, intermediate_size=176, num_hidden_layers=3,
                  num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=False),
    "llama-bias-tied": dict(model_type="llama", vocab_size=300, hidden_size=48, intermediate_size=96,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, attention_bias=True,
                            mlp_bias=True, tie_word_embeddings=True),
    "mistral": dict(model_type="mistral", vocab_size=512, hidden_size=96, intermediate_size=256, num_hidden_layers=2,
                    num_attention_heads=6, num_key_value_heads=2, head_dim=32, tie_word_embeddings=False),
    "qwen2": dict(model_type="qwen2", vocab_size=400, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False),
    "qwen3": dict(model_type="qwen3", vocab_size=400, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=24, tie_word_embeddings=True),
    "mixtral": dict(model_type="mixtral", vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                    tie_word_embeddings=False),
    "granite": dict(model_type="granite", vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False),
    "granitemoe": dict(model_type="granitemoe", vocab_size=256, hidden_size=32, intermediate_size=48,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                       num_experts_per_tok=2, tie_word_embeddings=True),
}


def model_of(cfg: dict, meta: bool = True):
    from transformers import AutoConfig, AutoModelForCausalLM

    conf = AutoConfig.for_model(**cfg)
    if meta:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(conf)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(conf, torch_dtype=torch.float32)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_parameter_count_equals_the_instantiated_model(name: str) -> None:
    cfg = CONFIGS[name]
    model = model_of(cfg)
    counted = sum(p.numel() for p in model.parameters())  # tied weights are one Parameter
    groups = parameter_groups(shape_of(cfg))
    assert sum(groups.values()) == counted
    emb = model.get_input_embeddings().weight.numel()
    assert groups["embedding"] == emb
    norms = sum(p.numel() for n, p in model.named_parameters() if "norm" in n)
    assert groups["norms"] == norms


def test_an_unknown_architecture_is_unknown_not_a_crash() -> None:
    part = SimpleNamespace(is_cpu=False, gpu_model="NVIDIA-H100-80GB-HBM3", gpu_memory_gb=None, memory_gb=1000)
    pred = predict({"number_gpus": 1}, "full", {"model_type": "gpt_neox", "hidden_size": 8}, part)
    assert pred.status == "unknown" and "gpt_neox" in pred.reason and pred.predicted_oom is None
    assert predict({"number_gpus": 1}, "full", None, part).status == "unknown"


@pytest.mark.parametrize("name, targets", [("llama", ("q_proj", "v_proj")),
                                           ("mistral", ("q_proj", "k_proj", "v_proj", "o_proj", "down_proj")),
                                           ("qwen2", ("gate_proj", "up_proj"))])
def test_lora_and_prompt_tuning_trainable_counts_equal_peft(name: str, targets: tuple[str, ...]) -> None:
    from peft import LoraConfig, PromptTuningConfig, get_peft_model

    cfg = CONFIGS[name]
    lora = get_peft_model(model_of(cfg, meta=False), LoraConfig(r=8, lora_alpha=16, target_modules=list(targets),
                                                                task_type="CAUSAL_LM", bias="none"))
    n = sum(p.numel() for p in lora.parameters() if p.requires_grad)
    assert trainable_parameters(shape_of(cfg), "lora", r=8, target_modules=targets) == n
    pt = get_peft_model(model_of(cfg, meta=False), PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=13))
    n = sum(p.numel() for p in pt.parameters() if p.requires_grad)
    assert trainable_parameters(shape_of(cfg), "pt", num_virtual_tokens=13) == n


def _step(model, optimizer) -> tuple[int, int]:
    """One real training step; (gradient bytes, optimizer state bytes) summed tensor by tensor."""
    ids = torch.randint(0, model.config.vocab_size, (2, 16))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
    state = sum(v.numel() * v.element_size() for st in optimizer.state.values() for v in st.values()
                if torch.is_tensor(v) and v.dim() > 0)  # per-tensor step counters are scalars
    return grads, state


@pytest.mark.parametrize("optim, make", [
    ("adamw_torch", lambda ps: torch.optim.AdamW(ps, lr=1e-4)),
    ("sgd", lambda ps: torch.optim.SGD(ps, lr=1e-4)),
    ("adagrad", lambda ps: torch.optim.Adagrad(ps, lr=1e-4)),
    ("rmsprop", lambda ps: torch.optim.RMSprop(ps, lr=1e-4)),
])
def test_gradients_and_optimizer_state_equal_a_real_step(optim: str, make) -> None:
    cfg = CONFIGS["llama"]
    model = model_of(cfg, meta=False)
    grads, state = _step(model, make([p for p in model.parameters() if p.requires_grad]))
    s = shape_of(cfg)
    trainable = trainable_parameters(s, "full")
    assert trainable * DTYPE_BYTES["float32"] == grads
    assert optimizer_bytes(optim, trainable, 4, s) == state


def test_lora_step_gradients_and_adam_state() -> None:
    from peft import LoraConfig, get_peft_model

    cfg = CONFIGS["mistral"]
    targets = ("q_proj", "v_proj")
    model = get_peft_model(model_of(cfg, meta=False), LoraConfig(r=4, target_modules=list(targets),
                                                                 task_type="CAUSAL_LM"))
    grads, state = _step(model, torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4))
    trainable = trainable_parameters(shape_of(cfg), "lora", r=4, target_modules=targets)
    assert grads == trainable * 4 and state == 2 * trainable * 4


def test_sharding_and_the_device_comparison() -> None:
    cfg = dict(CONFIGS["llama"], hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
               num_attention_heads=32, num_key_value_heads=4, vocab_size=32000)  # a TinyLlama-1.1B shape
    gpu = SimpleNamespace(is_cpu=False, gpu_model="NVIDIA-A100-SXM4-80GB", gpu_memory_gb=None, memory_gb=1000)
    base = {"number_gpus": 1, "number_nodes": 1, "batch_size": 4, "model_max_length": 1024, "torch_dtype": "bfloat16",
            "optim": "adamw_torch", "gradient_checkpointing": True}
    one = predict(base, "full", cfg, gpu)
    n = one.parameters
    assert one.param_bytes == n * 2 and one.grad_bytes == n * 2 and one.optimizer_bytes == 2 * n * 2
    assert one.device_bytes == 80e9 and one.device_source == "gpu_memory.yaml" and one.predicted_oom is False
    fsdp = predict({**base, "number_gpus": 4, "distributed_backend": "FSDP", "batch_size": 16}, "full", cfg, gpu)
    assert fsdp.param_bytes == n * 2 // 4 and fsdp.optimizer_bytes == 2 * n * 2 // 4
    zero2 = predict({**base, "number_gpus": 4, "distributed_backend": "FSDP", "fsdp_sharding_strategy": "SHARD_GRAD_OP",
                     "batch_size": 16}, "full", cfg, gpu)
    assert zero2.param_bytes == n * 2 and zero2.grad_bytes == n * 2 // 4
    ddp = predict({**base, "number_gpus": 4, "distributed_backend": "DDP", "batch_size": 16}, "full", cfg, gpu)
    assert ddp.param_bytes == n * 2
    small = SimpleNamespace(**{**gpu.__dict__, "gpu_memory_gb": 8})
    tight = predict(base, "full", cfg, small)
    assert tight.predicted_oom is True and tight.device_source == "inventory gpu_memory_gb"
    # gradient checkpointing keeps far less activation memory than storing every layer's
    assert predict({**base, "gradient_checkpointing": False}, "full", cfg, gpu).activation_bytes > \
        3 * one.activation_bytes


def test_plan_memory_json_flags_the_point_that_cannot_fit(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(dict(CONFIGS["mistral"], hidden_size=4096, intermediate_size=14336,
                                                       num_hidden_layers=32, num_attention_heads=32,
                                                       num_key_value_heads=8, head_dim=128, vocab_size=32000)))
    inv = write_yaml(tmp_path / "inv.yaml", {"cluster": "c", "partitions": {
        "l4": {"gpu_model": "NVIDIA-L4", "gpus_per_node": 8, "cpus_per_node": 64, "memory_gb": 512,
               "hosts": {"g1": {"address": "10.0.0.1"}}},
        "big": {"gpu_model": "NVIDIA-L4", "gpu_memory_gb": 2000, "gpus_per_node": 8, "cpus_per_node": 64,
                "memory_gb": 512, "hosts": {"g2": {"address": "10.0.0.2"}}}}})
    out = {}
    for part in ("l4", "big"):
        sw = write_yaml(tmp_path / f"{part}.yaml", {
            "campaign": part, "experiment": "finetune_full_benchmark-v1.0.0", "partition": part,
            "entity": {"model_name": "m7b", "model_max_length": 2048, "number_gpus": 1, "batch_size": 1},
            "model_map": {"m7b": str(model)}})
        (out[part],) = json.loads(sbench("plan", sw, "-i", inv, "--memory", "--json").stdout)
    assert out["l4"]["valid"] and out["l4"]["predicted_oom"] is True
    assert out["l4"]["memory"]["total_bytes"] > 24e9 and out["l4"]["memory"]["device_bytes"] == 24e9
    assert out["big"]["predicted_oom"] is False
    # ~7.2B parameters in bf16: the parameter bytes alone are about 14.5 GB
    assert 7.0e9 < out["l4"]["memory"]["parameters"] < 7.4e9


def test_submit_skips_the_points_predicted_not_to_fit(tmp_path: Path, tiny_model: Path, small_data_dir: Path) -> None:

    inv = write_yaml(tmp_path / "inv.yaml", kit.inventory(memory_gb=0.5))
    sw = write_yaml(tmp_path / "s.yaml", kit.sweep(tiny_model, small_data_dir, campaign="oom-skip",
                                                   entity={"model_max_length": 512, "max_steps": 1},
                                                   grid={"batch_size": [2, 512]}, runner={"workload": "idle"}))
    proc = sbench("submit", sw, "-i", inv, "--executor", "local", "--wait", "--skip-predicted-oom", "--no-prepare",
                  "--json", "--workdir", tmp_path / "runs", "--db", tmp_path / "r.duckdb")
    from harness.spec.inventory import load_inventory
    from harness.spec.plan import plan_sweep
    from harness.spec.sweep import load_sweep

    batch_of = {p.point_id: p.entity["batch_size"] for p in plan_sweep(load_sweep(sw), load_inventory(inv))}
    by_batch = {batch_of[d["point_id"]]: d for d in json.loads(proc.stdout)["points"]}
    assert by_batch[2]["action"] == "submit" and by_batch[2]["attempt"] == 1
    assert by_batch[512]["action"] == "skip" and by_batch[512]["reason"].startswith("predicted OOM: ")
    assert by_batch[512]["attempt"] is None


def test_a_bad_gpu_memory_gb_names_the_key(tmp_path: Path) -> None:
    from harness.contract.errors import InputError
    from harness.spec.inventory import load_inventory

    inv = write_yaml(tmp_path / "inv.yaml", {"cluster": "c", "partitions": {"g": {
        "gpu_model": "NVIDIA-L4", "gpu_memory_gb": "lots", "gpus_per_node": 1, "cpus_per_node": 2, "memory_gb": 8,
        "hosts": {"h": {"address": "10.0.0.1"}}}}})
    with pytest.raises(InputError, match=r"partitions\.g\.gpu_memory_gb must be a number"):
        load_inventory(inv)


@pytest.mark.parametrize("optim, part, expect", [
    ("adamw_hf", "gpu", "not an optimizer of transformers 5 (the sbench trainer's); use adamw_torch"),
    ("adamw_bnb_8bit", "cpu", "runs on CUDA kernels of bitsandbytes; partition 'cpu' is a CPU partition"),
    ("paged_adamw_8bit", "gpu", "needs the bitsandbytes package, which this environment"),
    ("adamw_bnb_8bit", "gpu-own-python", None),
    ("sgd", "cpu", None),
])
def test_plan_tells_which_optimizers_can_run_where(tmp_path: Path, optim: str, part: str, expect: str | None) -> None:
    import importlib.util

    from harness.spec.inventory import load_inventory
    from harness.spec.plan import plan_sweep
    from harness.spec.sweep import load_sweep

    if importlib.util.find_spec("bitsandbytes") is not None and "package" in (expect or ""):
        pytest.skip("bitsandbytes is installed here")
    hosts = {"h": {"address": "10.0.0.1"}}
    inv = write_yaml(tmp_path / "inv.yaml", {"cluster": "c", "partitions": {
        "cpu": {"gpu_model": "cpu", "gpus_per_node": 1, "cpus_per_node": 4, "memory_gb": 8, "hosts": hosts},
        "gpu": {"gpu_model": "NVIDIA-L4", "gpus_per_node": 1, "cpus_per_node": 4, "memory_gb": 8, "hosts": hosts},
        "gpu-own-python": {"gpu_model": "NVIDIA-L4", "gpus_per_node": 1, "cpus_per_node": 4, "memory_gb": 8,
                           "python": "/opt/env/bin/python", "hosts": hosts}}})
    sw = write_yaml(tmp_path / "s.yaml", {"campaign": "o", "experiment": "finetune_full_benchmark-v1.0.0",
                                          "partition": part,
                                          "entity": {"model_name": "m", "optim": optim, "model_max_length": 512,
                                                     "number_gpus": 1, "batch_size": 1},
                                          "model_map": {"m": "ibm-granite/granite-3b-code-base-2k"}})
    (pt,) = plan_sweep(load_sweep(sw), load_inventory(inv))
    if expect is None:
        assert pt.valid, pt.reasons
    else:
        assert not pt.valid and any(expect in r for r in pt.reasons), pt.reasons
    if part == "gpu-own-python" and importlib.util.find_spec("bitsandbytes") is None:
        assert any("needs bitsandbytes in the nodes' python (/opt/env/bin/python)" in n for n in pt.notes)


def test_fsdp_offload_params_is_a_real_setting_that_keeps_old_point_ids(tmp_path: Path) -> None:
    import hashlib

    from harness.build.render import render_points
    from harness.spec.inventory import load_inventory
    from harness.spec.plan import plan_sweep, point_id
    from harness.spec.sweep import load_sweep

    exp = "finetune_full_benchmark-v1.0.0"
    ent = {"model_name": "m", "number_gpus": 2, "batch_size": 2}
    before = hashlib.sha256(json.dumps({"experiment": exp, "entity": ent}, sort_keys=True,
                                       separators=(",", ":")).encode()).hexdigest()[:16]
    assert point_id(exp, {**ent, "fsdp_offload_params": False}) == before  # ids measured before the field stay
    assert point_id(exp, {**ent, "fsdp_offload_params": True}) != before
    hosts = {"h": {"address": "10.0.0.1"}}
    inv = write_yaml(tmp_path / "inv.yaml", {"cluster": "c", "partitions": {
        "gpu": {"gpu_model": "NVIDIA-A100-SXM4-80GB", "gpus_per_node": 4, "cpus_per_node": 32, "memory_gb": 256,
                "hosts": hosts},
        "cpu": {"gpu_model": "cpu", "gpus_per_node": 2, "cpus_per_node": 8, "memory_gb": 16, "hosts": hosts}}})
    got = {}
    for part in ("gpu", "cpu"):
        sw = write_yaml(tmp_path / f"{part}.yaml", {
            "campaign": part, "experiment": exp, "partition": part,
            "entity": {"model_name": "m", "model_max_length": 512, "batch_size": 4, "distributed_backend": "FSDP",
                       "fsdp_offload_params": True},
            "grid": {"number_gpus": [1, 2]}, "model_map": {"m": "ibm-granite/granite-3b-code-base-2k"}})
        got[part] = {p.entity["number_gpus"]: p for p in plan_sweep(load_sweep(sw), load_inventory(inv))}
    assert got["gpu"][2].valid
    assert "needs distributed_backend FSDP over 2 or more GPUs" in got["gpu"][1].reasons[0]
    assert "is a CPU partition" in got["cpu"][2].reasons[0]
    (spec,) = render_points(load_sweep(tmp_path / "gpu.yaml"), load_inventory(inv), [got["gpu"][2]], tmp_path / "r")
    assert spec.accelerate_config["fsdp_config"]["fsdp_offload_params"] is True


def test_offload_moves_the_shards_off_the_device() -> None:
    cfg = dict(CONFIGS["llama"], hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
               num_attention_heads=32, num_key_value_heads=4, vocab_size=32000)
    gpu = SimpleNamespace(is_cpu=False, gpu_model="NVIDIA-A100-SXM4-80GB", gpu_memory_gb=None, memory_gb=1000)
    base = {"number_gpus": 4, "number_nodes": 1, "batch_size": 16, "model_max_length": 1024,
            "torch_dtype": "bfloat16", "distributed_backend": "FSDP", "optim": "adamw_torch"}
    on, off = predict(base, "full", cfg, gpu), predict({**base, "fsdp_offload_params": True}, "full", cfg, gpu)
    assert off.optimizer_bytes == 0 and off.param_bytes < on.param_bytes / 4
    assert off.activation_bytes == on.activation_bytes and any("offload" in n for n in off.notes)


# -- DeepSpeed ZeRO and QLoRA -------------------------------------------------------------------------------

def _ds_inventory(tmp_path: Path, python: str | None = None) -> Path:
    hosts = {"h": {"address": "10.0.0.1"}}
    gpu = {"gpu_model": "NVIDIA-A100-SXM4-80GB", "gpus_per_node": 4, "cpus_per_node": 32, "memory_gb": 256,
           "hosts": hosts}
    if python:
        gpu["python"] = python
    return write_yaml(tmp_path / f"inv-{'own' if python else 'here'}.yaml", {"cluster": "c", "partitions": {
        "gpu": gpu,
        "cpu": {"gpu_model": "cpu", "gpus_per_node": 2, "cpus_per_node": 8, "memory_gb": 16, "hosts": hosts}}})


def _plan(tmp_path: Path, inv: Path, part: str, exp: str, entity: dict, grid: dict, name: str = "ds"):
    from harness.spec.inventory import load_inventory
    from harness.spec.plan import plan_sweep
    from harness.spec.sweep import load_sweep

    sw = write_yaml(tmp_path / f"{name}-{part}.yaml", {
        "campaign": name, "experiment": exp, "partition": part,
        "entity": {"model_name": "m", "model_max_length": 256, "batch_size": 4, "number_gpus": 2, **entity},
        "grid": grid, "model_map": {"m": "ibm-granite/granite-3b-code-base-2k"}})
    return load_sweep(sw), load_inventory(inv), plan_sweep(load_sweep(sw), load_inventory(inv))


_DS_CHECK = r"""
import json, os, sys
os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[3])
import deepspeed
from deepspeed.runtime.config import DeepSpeedConfig
from accelerate.commands.config.config_args import load_config_from_file
from accelerate.utils import DeepSpeedPlugin
deepspeed.init_distributed(dist_backend="gloo")
class Mpu:  # the data-parallel world the job will have (this check runs as one process)
    def get_data_parallel_world_size(self):
        return int(sys.argv[2])
acc = load_config_from_file(sys.argv[1])
path = acc.deepspeed_config["deepspeed_config_file"]
ds = DeepSpeedConfig(json.load(open(path)), mpu=Mpu())
plugin = DeepSpeedPlugin(hf_ds_config=path)
print(json.dumps({"distributed_type": str(acc.distributed_type), "stage": ds.zero_optimization_stage,
                  "plugin_stage": plugin.zero_stage, "train_batch": ds.train_batch_size,
                  "offload_optimizer": str(ds.zero_config.offload_optimizer.device)
                                       if ds.zero_config.offload_optimizer else None,
                  "offload_param": str(ds.zero_config.offload_param.device) if ds.zero_config.offload_param else None}))
"""


def _free_port() -> int:
    """A TCP port no process listens on now (other workers' jobs rendezvous on fixed ports too)."""
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        return int(sk.getsockname()[1])


@pytest.mark.parametrize("part", ["cpu", "gpu"])
@pytest.mark.slow(15)
def test_deepspeed_configs_are_accepted_by_deepspeed_and_accelerate(tmp_path: Path, part: str) -> None:
    """Every ZeRO stage x offload choice renders a deepspeed.json that deepspeed's own DeepSpeedConfig and
    accelerate's loader (config file + DeepSpeedPlugin) accept, with the values the point asked for."""
    pytest.importorskip("deepspeed")
    from harness.build.render import render_points

    sweep, inv, points = _plan(tmp_path, _ds_inventory(tmp_path, sys.executable), part,
                               "finetune_full_benchmark-v1.0.0",
                               {"distributed_backend": "DEEPSPEED", "gradient_accumulation_steps": 2},
                               {"deepspeed_zero_stage": [1, 2, 3], "deepspeed_offload_optimizer": [False, True],
                                "deepspeed_offload_params": [False, True]})
    valid = [p for p in points if p.valid]
    invalid = [p for p in points if not p.valid]
    assert len(valid) == 8 and len(invalid) == 4  # offload_params only with stage 3
    assert all("needs deepspeed_zero_stage 3" in p.reasons[0] for p in invalid)
    specs = render_points(sweep, inv, valid, tmp_path / "jobs")
    for p, spec in zip(valid, specs):
        assert spec.launcher == "accelerate" and "mixed_precision" not in spec.accelerate_config
        proc = subprocess.run([sys.executable, "-c", _DS_CHECK, str(spec.paths.accelerate), "2", str(_free_port())],
                              capture_output=True, text=True, cwd=ROOT, env={**__import__("os").environ,
                                                                             "DS_ACCELERATOR": "cpu"})
        assert proc.returncode == 0, proc.stderr[-3000:]
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        e = p.entity
        assert got["distributed_type"].endswith("DEEPSPEED")
        assert got["stage"] == got["plugin_stage"] == e["deepspeed_zero_stage"]
        assert got["train_batch"] == 4 * 2  # batch_size x accumulation
        assert (got["offload_optimizer"] or "").endswith("cpu") == e["deepspeed_offload_optimizer"]
        assert (got["offload_param"] or "").endswith("cpu") == e["deepspeed_offload_params"]
        ds = json.loads(spec.paths.deepspeed.read_text())
        assert ds["bf16"]["enabled"] is False  # bf16 false in the point (and always off on CPU)


def test_deepspeed_and_qlora_rules(tmp_path: Path) -> None:
    lora = "finetune_lora_benchmark-v1.0.0"
    inv = _ds_inventory(tmp_path)
    _, _, (fsdp,) = _plan(tmp_path, inv, "gpu", lora, {"distributed_backend": "FSDP", "deepspeed_zero_stage": 3},
                          {}, "fsdp")
    assert not fsdp.valid and "only apply to distributed_backend DEEPSPEED" in fsdp.reasons[0]
    # ZeRO-Offload on one device stays a DeepSpeed point (launched through accelerate)
    _, _, (one,) = _plan(tmp_path, inv, "cpu", lora, {"distributed_backend": "DEEPSPEED", "number_gpus": 1,
                                                      "deepspeed_offload_optimizer": True}, {}, "one")
    assert one.valid and one.entity["distributed_backend"] == "DEEPSPEED"
    _, _, (q_cpu,) = _plan(tmp_path, inv, "cpu", lora, {"use_qlora": True, "distributed_backend": "DDP"}, {}, "qc")
    assert not q_cpu.valid and "CUDA kernels" in q_cpu.reasons[0] and "CPU partition" in q_cpu.reasons[0]
    _, _, (q_full,) = _plan(tmp_path, inv, "gpu", "finetune_full_benchmark-v1.0.0", {"use_qlora": True}, {}, "qf")
    assert not q_full.valid and "use_qlora quantises the frozen base of a LoRA run" in q_full.reasons[0]
    _, _, (q_z3,) = _plan(tmp_path, _ds_inventory(tmp_path, "/opt/venv/bin/python"), "gpu", lora,
                          {"use_qlora": True, "distributed_backend": "DEEPSPEED", "deepspeed_zero_stage": 3}, {}, "qz")
    assert not q_z3.valid and "ZeRO-3" in q_z3.reasons[0]
    # On a GPU partition with its own python the package is the nodes' business: valid, with a note
    _, _, (q_gpu,) = _plan(tmp_path, _ds_inventory(tmp_path, "/opt/venv/bin/python"), "gpu", lora,
                           {"use_qlora": True, "distributed_backend": "DDP"}, {}, "qg")
    assert q_gpu.valid and any("bitsandbytes" in n for n in q_gpu.notes)
    import importlib.util

    if importlib.util.find_spec("bitsandbytes") is None:  # and checked here when the jobs use this python
        _, _, (q_here,) = _plan(tmp_path, inv, "gpu", lora, {"use_qlora": True, "distributed_backend": "DDP"}, {}, "qh")
        assert not q_here.valid and "pip install bitsandbytes" in q_here.reasons[0]


def _zero3_count(model, world: int, value_bytes: int) -> int:
    """ZeRO-3's parameters per rank, counted on the instantiated model: each tensor's padded partition,
    plus the whole tensor when it is under the persistence threshold (with one rank, the partition is it)."""
    from harness.contract.defaults import ZERO3_PERSISTENCE

    return sum(value_bytes * (-(-p.numel() // world) + (p.numel() if p.numel() < ZERO3_PERSISTENCE and world > 1
                                                         else 0))
               for p in model.parameters())


@pytest.mark.parametrize("name", ["llama", "mistral", "qwen2", "mixtral", "granitemoe"])
def test_zero_prediction_equals_a_count_of_the_model(name: str) -> None:
    cfg = dict(CONFIGS[name], hidden_size=512, intermediate_size=1024, num_attention_heads=8)
    cfg.pop("head_dim", None)
    model = model_of(cfg)
    total = sum(p.numel() for p in model.parameters())
    cpu = SimpleNamespace(is_cpu=True, gpu_model="cpu", gpu_memory_gb=None, memory_gb=64)
    base = {"number_gpus": 4, "number_nodes": 1, "batch_size": 4, "model_max_length": 128,
            "distributed_backend": "DEEPSPEED", "optim": "adamw_torch"}
    part = -(-total // 4)
    for stage in (1, 2, 3):
        p = predict({**base, "deepspeed_zero_stage": stage}, "full", cfg, cpu)
        params = 4 * total if stage < 3 else _zero3_count(model, 4, 4)
        assert p.param_bytes == params, stage
        assert p.grad_bytes == 4 * part, stage  # every stage keeps its partition of the reduced gradients
        assert p.optimizer_bytes == 12 * part, stage  # fp32 master + AdamW's two states, partitioned
    off = predict({**base, "deepspeed_zero_stage": 3, "deepspeed_offload_optimizer": True,
                   "deepspeed_offload_params": True}, "full", cfg, cpu)
    assert off.optimizer_bytes == 0 and off.host["optimizer_bytes"] == 12 * part
    assert off.host["param_bytes"] == _zero3_count(model, 4, 4)
    layer = sum(p.numel() for p in model.model.layers[0].parameters())  # the largest gathered unit
    assert off.param_bytes == 4 * max(layer, model.get_input_embeddings().weight.numel())


def test_qlora_prediction_quantises_the_linear_layers() -> None:
    from harness.spec.memory import QLORA_BYTES_PER_WEIGHT

    cfg = CONFIGS["llama"]
    model = model_of(cfg)
    linear = sum(m.weight.numel() for n, m in model.named_modules()
                 if isinstance(m, torch.nn.Linear) and not n.endswith("lm_head"))
    total = sum(p.numel() for p in model.parameters())
    gpu = SimpleNamespace(is_cpu=False, gpu_model="NVIDIA-A100-SXM4-80GB", gpu_memory_gb=None, memory_gb=1000)
    base = {"number_gpus": 1, "number_nodes": 1, "batch_size": 4, "model_max_length": 128, "torch_dtype": "bfloat16",
            "optim": "adamw_torch", "r": 4}
    targets = ("q_proj", "v_proj")
    plain = predict(base, "lora", cfg, gpu, target_modules=targets)
    q = predict({**base, "use_qlora": True}, "lora", cfg, gpu, target_modules=targets)
    adapters = plain.trainable
    assert q.param_bytes == int(linear * QLORA_BYTES_PER_WEIGHT) + (total - linear) * 2 + adapters * 2
    assert plain.param_bytes == total * 2 + adapters * 4
    assert q.grad_bytes == adapters * 2 and q.optimizer_bytes == 2 * adapters * 2


def test_activation_error_comes_from_the_cuda_allocator_and_is_null_without_it() -> None:
    """On CUDA the activations are what a recorded forward pass adds to the allocator (largest step), and the
    estimate's error sits beside them; CPU snapshots have no allocator figures, so both stay NULL."""
    from harness.collect.rows import RunData, memory_properties

    def snap(step, phase, alloc):
        return {"rank": 0, "step": step, "phase": phase, "cuda_allocated_bytes": alloc, "cuda_peak_bytes": alloc,
                "params_bytes": 10, "grads_bytes": 5 if phase == "after_backward" else 0, "optimizer_bytes": 20}

    phases = ("before_forward", "after_forward", "after_backward", "after_optimizer")
    cuda = [snap(s, ph, a) for s, allocs in ((0, (100, 700, 300, 300)), (1, (300, 1100, 300, 300)))
            for ph, a in zip(phases, allocs)]
    d = RunData(run={}, memory=cuda, memory_prediction={"activation_bytes": 1000})
    got = memory_properties(d)
    assert got["activation_bytes"] == 800 and got["activation_error"] == pytest.approx(1000 / 800 - 1)
    assert got["grads_bytes"] == 5 and got["memory_peak_bytes"] == 1100
    cpu = [{**r, "cuda_allocated_bytes": None, "cuda_peak_bytes": None} for r in cuda]
    got = memory_properties(RunData(run={}, memory=cpu, memory_prediction={"activation_bytes": 1000}))
    assert got["activation_bytes"] is None and got["activation_error"] is None


@pytest.mark.parametrize("args,buffers", [(None, 0), ("momentum=0.9", 1), ("momentum=0.9,nesterov=true", 1),
                                          ("momentum=0,dampening=0.1", 0)])
def test_sgd_state_follows_its_momentum_in_transformers_own_optimizer(tmp_path: Path, args, buffers) -> None:
    """optim sgd with the point's optim_args, built by transformers' Trainer and stepped once: its state is one
    momentum buffer per trainable tensor exactly when the momentum is not zero, as predicted."""
    from transformers import Trainer, TrainingArguments

    cfg = CONFIGS["llama"]
    model = model_of(cfg, meta=False)
    targs = TrainingArguments(output_dir=str(tmp_path), optim="sgd", optim_args=args, use_cpu=True, report_to=[],
                              learning_rate=1e-3)
    opt = Trainer(model=model, args=targs).create_optimizer()
    _grads, state = _step(model, opt)
    n = sum(p.numel() for p in model.parameters())
    assert state == buffers * n * 4
    assert optimizer_bytes("sgd", n, 4, shape_of(cfg), "full", args) == state


def test_optim_args_is_checked_as_input() -> None:
    from harness.spec.catalog import optim_args

    assert optim_args("momentum=0.9, nesterov=true") == {"momentum": "0.9", "nesterov": "true"}
    for bad in ("momentum", "momentum=0.9;id", "=1", "a=b=c"):
        with pytest.raises(ValueError):
            optim_args(bad)


# -- the catalogue's architecture facts (harness/spec/model_configs.yaml) ----------------------------------------
# Published sizes, in parameters: the model cards' (and the weights' own count where the card rounds).
PUBLISHED_PARAMETERS = {
    "llama-7b": 6.74e9, "llama-13b": 13.0e9, "llama2-70b": 69.0e9, "llama3-8b": 8.03e9, "llama3-70b": 70.6e9,
    "llama3.1-8b": 8.03e9, "llama3.1-70b": 70.6e9, "llama3.1-405b": 405e9, "llama3.2-1b": 1.24e9,
    "llama3.2-3b": 3.21e9, "mistral-7b-v0.1": 7.24e9, "mistral-123b-v2": 123e9, "mixtral-8x7b-instruct-v0.1": 46.7e9,
    "granite-7b-base": 6.74e9, "granite-8b-code-base": 8.05e9, "granite-8b-code-instruct": 8.05e9,
    "granite-8b-code-base-128k": 8.05e9, "granite-3b-code-base-128k": 3.48e9, "granite-3-8b": 8.17e9,
    "granite-3.1-2b": 2.53e9, "granite-3.1-8b-instruct": 8.17e9, "granite-3.3-8b": 8.17e9,
    "granite-3.0-1b-a400m-base": 1.33e9, "granite-3.1-3b-a800m-instruct": 3.3e9, "smollm2-135m": 134.5e6,
}
# Reference-deployment models whose config is not public: no facts, and plan says so.
PRIVATE_MODELS = {"granite-3b-1.5", "granite-8b-japanese", "allam-1-13b"}


def _catalogue_names() -> set[str]:
    from harness.spec.catalog import BENCHMARK_MODELS, GPTQ_MODELS
    from harness.spec.modelmap import builtin_model_map

    return set(BENCHMARK_MODELS) | set(GPTQ_MODELS) | set(builtin_model_map().names())


def test_every_catalogue_model_has_its_facts_or_is_a_private_one() -> None:
    from harness.spec.memory import Unsupported
    from harness.spec.modelconfig import catalogue_configs

    facts = catalogue_configs()
    assert set(facts) == _catalogue_names() - PRIVATE_MODELS
    for name, cfg in facts.items():
        try:
            shape_of(cfg)
        except Unsupported as exc:  # an architecture with no formula carries its model_type, and plan names it
            assert set(cfg) == {"model_type"} and cfg["model_type"] in str(exc), name
        else:
            assert name in PUBLISHED_PARAMETERS, f"{name}: a supported architecture needs its published size here"


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMETERS))
def test_catalogue_facts_give_the_published_parameter_count(name: str) -> None:
    from harness.spec.modelconfig import catalogue_configs

    cfg = catalogue_configs()[name]
    counted = sum(parameter_groups(shape_of(cfg)).values())
    assert counted == pytest.approx(PUBLISHED_PARAMETERS[name], rel=0.015), f"{name}: {counted:,}"
    assert cfg["max_position_embeddings"] >= 2048 and cfg["torch_dtype"] in ("bfloat16", "float16")
    if cfg.get("num_local_experts"):
        assert 0 < cfg["num_experts_per_tok"] < cfg["num_local_experts"]


def test_catalogue_facts_instantiate_the_architecture_they_name() -> None:
    """A few of them, built on the meta device by transformers itself: the same count as the formula."""
    from harness.spec.modelconfig import catalogue_configs

    for name in ("smollm2-135m", "granite-3b-code-base-128k", "granite-3.1-3b-a800m-instruct", "llama3.2-1b"):
        cfg = catalogue_configs()[name]
        model = model_of({k: v for k, v in cfg.items() if k not in ("torch_dtype",)})
        assert sum(p.numel() for p in model.parameters()) == sum(parameter_groups(shape_of(cfg)).values()), name


def test_plan_memory_predicts_a_catalogue_model_with_no_weights_here(tmp_path: Path) -> None:
    """llama3.1-8b maps to a path this machine does not have: the catalogue's facts predict it, a local
    config.json wins where there is one, and the summary counts what was not predicted apart."""
    inv = write_yaml(tmp_path / "inv.yaml", {"cluster": "c", "partitions": {"a100": {
        "gpu_model": "NVIDIA-A100-SXM4-80GB", "gpus_per_node": 8, "cpus_per_node": 64, "memory_gb": 512,
        "hosts": {"g1": {"address": "10.0.0.1"}}}}})
    local = tmp_path / "small-1b"
    local.mkdir()
    (local / "config.json").write_text(json.dumps(dict(CONFIGS["llama"])))
    sw = write_yaml(tmp_path / "s.yaml", {
        "campaign": "m", "experiment": "finetune_full_benchmark-v1.0.0",
        "entity": {"model_max_length": 4096, "number_gpus": 1, "batch_size": 1},
        "grid": {"model_name": ["llama3.1-8b", "mixtral-8x7b-instruct-v0.1", "allam-1-13b", "llama3.2-1b"]},
        "model_map": {"llama3.2-1b": str(local)}})  # a catalogue name whose config.json is readable: it wins
    proc = sbench("plan", sw, "-i", inv, "--memory", "--json")
    by = {p["entity"]["model_name"]: p for p in json.loads(proc.stdout)}
    assert not Path(by["llama3.1-8b"]["model_source"]).exists()
    m8 = by["llama3.1-8b"]["memory"]
    assert m8["status"] == "ok" and m8["parameters"] == 8_030_261_248 and "catalogue" in m8["config_source"]
    assert m8["param_bytes"] == 2 * 8_030_261_248 and by["llama3.1-8b"]["predicted_oom"] is False
    assert by["mixtral-8x7b-instruct-v0.1"]["predicted_oom"] is True  # 46.7B in bf16 on one 80 GB device
    assert by["allam-1-13b"]["memory"]["status"] == "unknown" and by["allam-1-13b"]["predicted_oom"] is None
    assert "ships no architecture facts" in by["allam-1-13b"]["memory"]["reason"]
    mine = by["llama3.2-1b"]["memory"]
    assert mine["config_source"] == f"{local}/config.json"
    assert mine["parameters"] == sum(parameter_groups(shape_of(CONFIGS["llama"])).values())
    text = sbench("plan", sw, "-i", inv, "--memory", ok=None).stdout
    assert "memory of 4 valid run(s): 2 predicted to fit, 1 predicted not to fit" in text
    assert "1 not predicted (the reasons column says why)" in text
    assert "memory not predicted: the config.json of allam-1-13b is not readable here" in text
