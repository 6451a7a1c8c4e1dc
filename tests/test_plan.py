"""Plan: defaults, stable ids, and the reference validity rules checked against an independent oracle."""

from __future__ import annotations

import importlib.util
import json
import random
import shutil
from pathlib import Path

import pytest
import yaml

from harness.spec.catalog import EXPERIMENTS, LORA_TARGET_MODULES
from harness.spec.modelmap import builtin_model_map

from .kit import SMALL_DATASET, write_yaml


def seed_rules_oracle(e: dict, num_local_experts: int | None) -> set[int]:
    """The is_valid rules 1-7, written from the reference text, independently of harness.plan."""
    broken = set()
    gpus, nodes, bs = e["number_gpus"], e["number_nodes"], e["batch_size"]
    if gpus > 0 and bs % gpus != 0:
        broken.add(1)
    if nodes > 0 and gpus % nodes != 0:
        broken.add(2)
    if not nodes > 0:
        broken.add(3)
    if not bs > 0:
        broken.add(4)
    if gpus > 0 and not e["gpu_model"]:
        broken.add(5)
    if e["fast_moe"]:
        if gpus % e["fast_moe"] != 0:
            broken.add(6)
        if num_local_experts is None or num_local_experts % e["fast_moe"] != 0:
            broken.add(7)
    return broken


def big_inventory(tmp_path: Path) -> Path:
    hosts = {f"n{i:02d}": {"address": f"10.0.0.{i}"} for i in range(64)}
    p = tmp_path / "big.yaml"
    p.write_text(yaml.safe_dump({"cluster": "big", "defaults": {"envs_dir": str(tmp_path / "envs")},
                                 "partitions": {"p": {"gpu_model": "X", "gpus_per_node": 16, "cpus_per_node": 1000,
                                                      "memory_gb": 2000, "hosts": hosts}}}))
    return p


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_plan_json_agrees_with_reference_rules_on_random_points(seed: int, cli, tmp_path: Path) -> None:
    rng = random.Random(seed)
    moe = tmp_path / "moe"
    moe.mkdir()
    experts = rng.choice([4, 6, 8])
    (moe / "config.json").write_text(json.dumps({"model_type": "mixtral", "num_local_experts": experts}))
    grid = {
        "number_gpus": sorted(rng.sample(range(0, 17), 6)),
        "number_nodes": sorted(rng.sample([-1, 0, 1, 2, 3, 4], 4)),
        "batch_size": sorted(rng.sample(range(-2, 65), 6)),
        "fast_moe": sorted(rng.sample([0, 1, 2, 3, 4, 8], 3)),
        "gpu_model": ["", "X"],
    }
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({
        "campaign": "oracle", "experiment": "finetune_full_benchmark-v1.0.0",
        # fast_moe runs in the fms-hf-tuning trainer (2.4.0 and later) only: the oracle's rules are the rest.
        "entity": {"model_name": "moe-test", "model_max_length": 256, "trainer": "fms-hf-tuning",
                   "fms_hf_tuning_version": "3.2.2"},
        "grid": grid, "model_map": {"moe-test": str(moe)}}))
    res = cli("plan", sweep, "-i", big_inventory(tmp_path), "--json")
    assert res.exit_code == 0, res.output
    points = json.loads(res.stdout)
    n = 1
    for v in grid.values():
        n *= len(v)
    assert len(points) == n  # every combination reported, invalid ones included
    for p in points:
        e = p["entity"]
        expected = seed_rules_oracle(e, experts)
        got = {int(r.split(":")[0].split()[1]) for r in p["reasons"] if r.startswith("rule ")}
        assert got == expected, (e, p["reasons"])
        others = [r for r in p["reasons"] if not r.startswith("rule ")]
        assert not others, others  # the partition is big enough: no placement reasons
        assert p["valid"] == (not expected)
        for key in ("point_id", "experiment", "entity", "valid", "reasons"):
            assert key in p


def test_rule7_not_checkable_without_local_config(cli, tmp_path: Path) -> None:
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({
        "campaign": "r7", "experiment": "finetune_full_benchmark-v1.0.0",
        "entity": {"model_name": "mixtral-8x7b-instruct-v0.1", "model_max_length": 256, "number_gpus": 8,
                   "batch_size": 8, "fast_moe": 2, "trainer": "fms-hf-tuning", "fms_hf_tuning_version": "3.2.2"}}))
    res = cli("plan", sweep, "-i", big_inventory(tmp_path), "--json")
    p = json.loads(res.stdout)[0]
    assert p["valid"] is True
    assert any(n.startswith("rule 7 could not be checked") for n in p["notes"])


def test_defaults_resolved_and_ids_stable(cli, tmp_path: Path) -> None:
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({
        "campaign": "d", "experiment": "finetune_lora_benchmark-v1.0.0",
        "entity": {"model_name": "smollm2-135m", "model_max_length": 512, "batch_size": 8},
        "grid": {"number_gpus": [1, 2], "distributed_backend": ["FSDP", "DDP"]}, "repeats": 2}))
    res = cli("plan", sweep, "--json")
    points = json.loads(res.stdout)
    lora = EXPERIMENTS["finetune_lora_benchmark-v1.0.0"]
    # 1 GPU: the backend is ignored (single device), so FSDP and DDP are the same point.
    ids = {(p["entity"]["number_gpus"], p["entity"]["distributed_backend"]) for p in points}
    assert ids == {(1, None), (2, "FSDP"), (2, "DDP")}
    assert len(points) == 3 * 2  # x repeats
    e = points[0]["entity"]
    for f in lora.fields:
        assert f.name in e
    assert e["r"] == 4 and e["lora_alpha"] == 16 and e["gradient_accumulation_steps"] == 4
    assert e["torch_dtype"] == "bfloat16" and e["dataset_id"] == "news-tokens-16384plus-entries-4096"
    assert e["gpu_model"] == "cpu"  # from the local inventory's partition
    again = json.loads(cli("plan", sweep, "--json").stdout)
    assert [p["point_id"] for p in again] == [p["point_id"] for p in points]
    # The id follows values, not spelling: reordering keys keeps it.
    doc = yaml.safe_load(sweep.read_text())
    doc["entity"] = dict(reversed(list(doc["entity"].items())))
    sweep.write_text(yaml.safe_dump(doc, sort_keys=False))
    assert {p["point_id"] for p in json.loads(cli("plan", sweep, "--json").stdout)} == {p["point_id"] for p in points}


def test_placement_rules(cli, tmp_path: Path) -> None:
    root = Path(__file__).resolve().parent.parent
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({
        "campaign": "pl", "experiment": "finetune_gtpq-lora_benchmark-v1.0.0", "partition": "cpu",
        "entity": {"model_name": "llama-7b", "model_max_length": 256, "batch_size": 8},
        "grid": {"number_gpus": [2, 8], "number_nodes": [1, 4]}}))
    points = json.loads(cli("plan", sweep, "-i", root / "tests/fixtures/inventory/testcluster.yaml", "--json").stdout)
    assert all(not p["valid"] for p in points)
    for p in points:
        assert any("needs CUDA GPUs; partition 'cpu' is a CPU partition" in r for r in p["reasons"])
    by = {(p["entity"]["number_gpus"], p["entity"]["number_nodes"]): p["reasons"] for p in points}
    assert any("8 worker processes per node requested" in r for r in by[(8, 1)])
    assert any("number_nodes 4 exceeds the 2 host(s)" in r for r in by[(8, 4)])


def test_experiments_catalog(cli) -> None:
    res = cli("experiments", "list", "--json")
    ids = [e["id"] for e in json.loads(res.stdout)]
    assert ids == ["finetune_full_benchmark-v1.0.0", "finetune_lora_benchmark-v1.0.0",
                   "finetune_pt_benchmark-v1.0.0", "finetune_gtpq-lora_benchmark-v1.0.0",
                   "finetune_full_stability-v1.0.0"]
    show = json.loads(cli("experiments", "show", "finetune_lora_benchmark-v1.0.0", "--json").stdout)
    assert {f["name"] for f in show["required"]} == {"model_name", "model_max_length", "number_gpus", "batch_size",
                                                     "gpu_model"}
    opt = {f["name"]: f for f in show["optional"]}
    assert opt["r"]["default"] == 4 and opt["lora_alpha"]["default"] == 16
    assert opt["optim"]["default"] == "adamw_torch" and "schedule_free_sgd" in opt["optim"]["domain"]
    assert show["target_modules"]["granite-13b-v2"] == ["c_attn", "c_proj"]
    assert show["target_modules"]["llama-7b"] == ["q_proj", "k_proj"]
    gptq = json.loads(cli("experiments", "show", "finetune_gtpq-lora_benchmark-v1.0.0", "--json").stdout)
    assert [f["domain"] for f in gptq["optional"] if f["name"] == "torch_dtype"] == [["float16"]]
    stab = json.loads(cli("experiments", "show", "finetune_full_stability-v1.0.0", "--json").stdout)
    assert stab["measured_properties"] == ["f_gpu_oom", "f_other_error", "f_no_error", "is_valid"]
    table = cli("experiments", "show", "finetune_pt_benchmark-v1.0.0")
    assert table.exit_code == 0 and "model_max_length" in table.output


def test_every_seed_model_is_mapped_and_overridable(cli, tmp_path: Path) -> None:
    mm = builtin_model_map()
    for exp in EXPERIMENTS.values():
        for m in exp.models:
            assert mm.source(m), m
    assert set(LORA_TARGET_MODULES) <= set(mm.entries)
    override = tmp_path / "mm.yaml"
    override.write_text("smollm2-135m: ./weights/smol\n")
    (tmp_path / "weights/smol").mkdir(parents=True)
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({
        "campaign": "mm", "experiment": "finetune_full_benchmark-v1.0.0",
        "entity": {"model_name": "smollm2-135m", "model_max_length": 512, "batch_size": 1, "number_gpus": 1}}))
    p = json.loads(cli("plan", sweep, "--model-map", override, "--json").stdout)[0]
    assert p["model_source"] == str((tmp_path / "weights/smol").resolve())
    doc = yaml.safe_load(sweep.read_text())
    doc["model_map"] = {"smollm2-135m": "my-org/smol"}  # the sweep's own section wins over the file
    sweep.write_text(yaml.safe_dump(doc))
    p = json.loads(cli("plan", sweep, "--model-map", override, "--json").stdout)[0]
    assert p["model_source"] == "my-org/smol"


def _masked_by_recount(model: Path, dataset: Path, max_len: int) -> int:
    """Entries none of whose first *max_len* tokens starts at or after the response template: counted with the
    model's own tokenizer and its character offsets, independently of sbench's prepared data."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))
    template = "\n### Response:"
    masked = 0
    for line in dataset.open():
        text = json.loads(line)["output"]
        start = text.index(template) + len(template)
        offsets = tok(text, truncation=True, max_length=max_len, return_offsets_mapping=True)["offset_mapping"]
        masked += not any(s >= start and e > s for s, e in offsets)
    return masked


def test_plan_warns_once_per_setting_the_trainer_will_change(cli, tmp_path, tiny_model, small_data_dir) -> None:
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(small_data_dir / f"{SMALL_DATASET}.jsonl", data)
    inv = write_yaml(tmp_path / "inv.yaml", {"cluster": "c", "partitions": {
        "cpu": {"gpu_model": "cpu", "gpus_per_node": 2, "cpus_per_node": 4, "memory_gb": 16,
                "hosts": {"c1": {"address": "127.0.0.1"}}},
        "gpu": {"gpu_model": "NVIDIA-A100-SXM4-80GB", "gpus_per_node": 8, "cpus_per_node": 64, "memory_gb": 512,
                "hosts": {"g1": {"address": "10.0.0.1"}}}}})
    doc = {"campaign": "w", "experiment": "finetune_lora_benchmark-v1.0.0", "partition": "cpu",
           "entity": {"model_name": "tiny", "model_max_length": 256, "dataset_id": SMALL_DATASET, "batch_size": 4},
           "grid": {"number_gpus": [1, 2], "torch_dtype": ["bfloat16", "float32"]},
           "model_map": {"tiny": str(tiny_model)}, "data_dir": str(data)}
    sweep = write_yaml(tmp_path / "s.yaml", doc)

    def warnings(partition: str = "cpu") -> list[str]:
        res = cli("plan", write_yaml(sweep, {**doc, "partition": partition}), "-i", inv)
        assert res.exit_code == 0, res.output
        return [line for line in res.stderr.splitlines() if line.startswith("warning:")]

    # A CPU partition: bfloat16 loads float32 (2 of the 4 points ask it), flash-attention runs as sdpa (all 4).
    # Nothing about masked entries: the training data is not prepared yet, and plan does not guess.
    cpu = warnings()
    assert len(cpu) == 2, cpu
    assert "torch_dtype bfloat16 load float32 weights" in cpu[0] and cpu[0].endswith("(2 run(s))")
    assert "flash-attention runs as sdpa attention" in cpu[1] and cpu[1].endswith("(4 run(s))")
    points = json.loads(cli("plan", sweep, "-i", inv, "--json").stdout)
    assert sorted(len(p["warnings"]) for p in points) == [1, 1, 2, 2]
    # A GPU partition whose jobs run in this python: without flash_attn, sdpa (once, for the 4 points).
    if importlib.util.find_spec("flash_attn") is None:
        (gpu,) = warnings("gpu")
        assert "no flash_attn package" in gpu and gpu.endswith("(4 run(s))")
    # Once the training data is prepared, plan counts the entries whose response lies beyond 256 tokens.
    res = cli("prepare", write_yaml(sweep, doc), "-i", inv)
    assert res.exit_code == 0, res.output
    masked = _masked_by_recount(tiny_model, data / f"{SMALL_DATASET}.jsonl", 256)
    assert 0 < masked < 64  # the length is chosen so that some responses fall beyond it, not all
    (line,) = [w for w in warnings() if "response token" in w]
    assert line.startswith(f"warning: {masked} of 64 entries of {SMALL_DATASET} have no response token within "
                           "max_seq_length 256") and line.endswith("(4 run(s))")



@pytest.mark.train
def test_submit_shows_the_warnings_plan_shows(cli, trained) -> None:
    """A user who submits without running plan first still reads what the trainer will run otherwise than
    asked: submit prints plan's warnings, once per cause (the session's trained campaigns ask bfloat16 on a CPU
    partition)."""
    planned = [line for line in cli("plan", trained.sweep, "-i", trained.inventory).stderr.splitlines()
               if line.startswith("warning:")]
    assert any("load float32 weights" in w and w.endswith("(2 run(s))") for w in planned), planned
    shown = [line for line in trained.submits["nightly-2"]["stderr"].splitlines() if line.startswith("warning:")]
    assert set(planned) <= set(shown), (planned, shown)
    assert len(shown) == len(set(shown))  # once per cause
    assert trained.submits["nightly-1"]["json"]["warnings"] == [w.removeprefix("warning: ") for w in shown]
