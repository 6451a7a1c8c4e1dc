"""Real runs: job dirs rendered with the sbench library, ``bash launch.sh``, the tiny model on CPU.

Every number asserted here comes from the run: global steps, token counts recounted
independently, sample timestamps inside the run window, stage order. Marked ``train``.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.build.render import render_points
from harness.contract.paths import JobPaths
from harness.runner.stages import open_stages, read_stages
from harness.spec.inventory import local_inventory
from harness.spec.plan import plan_sweep
from harness.spec.sweep import parse_sweep

pytestmark = pytest.mark.train

DATASET = "news-chars-512-entries-4096"
AUTO = "WARMUP_60S_STABLE_120S_OR_10_STEPS"


@pytest.fixture(scope="module")
def inventory():
    """This machine, with room for two CPU worker processes (the placement check wants 2 CPUs each)."""
    inv = local_inventory()
    part = next(iter(inv.partitions.values()))
    part = dataclasses.replace(part, cpus_per_node=max(part.cpus_per_node, 4), gpus_per_node=max(part.gpus_per_node, 2))
    return dataclasses.replace(inv, partitions={part.name: part})


@pytest.fixture(scope="module")
def host(inventory) -> str:
    return next(iter(next(iter(inventory.partitions.values())).hosts))


@pytest.fixture(scope="module")
def small_data(tmp_path_factory) -> Path:
    """A data dir whose news-chars-512 file holds 64 generated entries and no sidecar.

    Without the sidecar ``ensure_dataset`` treats the file as external and uses it as is, so
    runs start in seconds instead of encoding 4096 entries per rank.
    """
    from harness.data.datagen import generate_dataset

    src = tmp_path_factory.mktemp("gen") / f"{DATASET}.jsonl"
    generate_dataset(DATASET, src, entries=64)
    d = tmp_path_factory.mktemp("data")
    shutil.copy(src, d / f"{DATASET}.jsonl")
    return d


def render(tmp_path: Path, inventory, model: Path, data_dir: Path, *, experiment: str, entity: dict[str, Any],
           grid: dict[str, list[Any]] | None = None, runner: dict[str, Any] | None = None) -> list[JobPaths]:
    doc = {"campaign": "rt", "experiment": experiment,
           "entity": {"model_name": "tiny", "model_max_length": 96, "dataset_id": DATASET,
                      "gradient_accumulation_steps": 1, **entity},
           "grid": grid or {}, "model_map": {"tiny": str(model)}, "data_dir": str(data_dir),
           "runner": {"sample_interval_s": 0.25, **(runner or {})}}
    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text(yaml.safe_dump(doc))
    sweep = parse_sweep(doc, str(sweep_file), tmp_path)
    points = plan_sweep(sweep, inventory)
    bad = [p.reasons for p in points if not p.valid]
    assert not bad, bad
    specs = render_points(sweep, inventory, points, tmp_path / "runs")
    return [JobPaths(s.job_dir) for s in specs]


def launch(paths: JobPaths, host: str, env: dict[str, str] | None = None,
           timeout: float = 300) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBENCH_FAULT"))}
    e.update({"SBENCH_HOST": host, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **(env or {})})
    return subprocess.run(["bash", str(paths.launch)], env=e, capture_output=True, text=True, timeout=timeout)


def load(p: Path) -> Any:
    return json.loads(p.read_text())


def samples(paths: JobPaths, host: str) -> list[dict[str, str]]:
    with open(paths.samples(host), newline="") as f:
        return list(csv.DictReader(f))


def check_common(paths: JobPaths, host: str, ranks: list[int]) -> dict[str, Any]:
    """What every successful run must leave behind; returns result.<host>.json."""
    res = load(paths.result(host))
    assert res["outcome"] == "ok", (res["reason"], paths.train_log(host).read_text()[-3000:])
    assert res["exit_code"] == 0 and res["signal"] is None
    assert [r["rank"] for r in res["ranks"]] == ranks
    events = read_stages(paths.stages(host))
    assert open_stages(events) == []
    node = [e["stage"] for e in events if e["rank"] is None and e["event"] == "start"]
    assert node == ["setup", "dataset", "teardown"]
    for r in ranks:
        seq = [e["stage"] for e in events if e["rank"] == r and e["event"] == "start"]
        assert seq == ["launch", "dataset", "tokens", "model_load", "train"], seq
        assert all(e["status"] == "ok" for e in events if e["rank"] == r and e["event"] == "end")
    t = {(e["stage"], e["rank"], e["event"]): e["t_wall"] for e in events}
    assert t[("dataset", None, "end")] <= t[("dataset", ranks[0], "start")]
    # launch opens when the runner started the command (after its dataset stage) and ends before the data stages
    for r in ranks:
        assert t[("dataset", None, "end")] <= t[("launch", r, "start")] <= t[("launch", r, "end")] \
            <= t[("dataset", r, "start")]
    assert max(t[("train", r, "end")] for r in ranks) <= t[("teardown", None, "start")]
    # samples: rows inside the run, the process tree seen working
    rows = samples(paths, host)
    assert res["samples"] == len(rows) > 0
    tw = [float(r["t_wall"]) for r in rows]
    assert res["started_wall"] <= min(tw) and max(tw) <= res["ended_wall"]
    proc = [r for r in rows if r["kind"] == "proc"]
    assert proc and max(float(r["cpu_pct"]) for r in proc) > 20
    train = res["training"]
    assert train["train_start_wall"] < train["train_end_wall"] <= res["ended_wall"]
    inside = [x for x in tw if train["train_start_wall"] <= x <= train["train_end_wall"]]
    assert inside or train["train_end_wall"] - train["train_start_wall"] < 0.5
    m = train["metrics"]
    assert m["train_runtime"] > 0 and m["train_samples_per_second"] > 0 and m["train_tokens_per_second"] > 0
    assert m["dataset_tokens"] > 0 and m["run_train_tokens"] >= m["dataset_tokens"] >= m["rank_dataset_tokens"]
    assert res["log_history"] and res["log_history"][-1]["step"] == train["global_step"]
    env = load(paths.environment(host))
    assert env["host"] == host and env["packages"]["trl"]
    return res


# -- the methods, one and two processes ------------------------------------------------------

def test_full_single_process_generates_dataset_and_trains(tmp_path, inventory, host, tiny_model):
    data_dir = tmp_path / "data"  # empty: the node runner's dataset stage generates the file
    (paths,) = render(tmp_path, inventory, tiny_model, data_dir, experiment="finetune_full_benchmark-v1.0.0",
                      entity={"number_gpus": 1, "batch_size": 2, "max_steps": 4, "torch_dtype": "bfloat16"})
    proc = launch(paths, host, env={"HF_TOKEN": "hf_do_not_leak_42"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (data_dir / f"{DATASET}.jsonl").is_file() and (data_dir / f"{DATASET}.jsonl.meta.json").is_file()
    res = check_common(paths, host, [0])
    train = res["training"]
    assert train["global_step"] == 4 and train["stopped_by"] == "max_steps"
    assert train["metrics"]["train_steps"] == 4 and train["metrics"]["train_samples"] == 8
    assert train["metrics"]["dataset_tokens"] == train["metrics"]["rank_dataset_tokens"] == 8 * 96
    assert train["dataset_token_counts"]["entries"] == 4096
    rank = res["ranks"][0]
    assert rank["device"] == "cpu" and rank["settings"]["torch_dtype"] == "float32"
    assert any("float32: no CUDA" in n for n in rank["notes"])
    assert rank["model"]["trainable_parameters"] == rank["model"]["parameters"]  # full fine-tuning
    assert "HF_TOKEN" not in rank["env"] and rank["env"]["SBENCH_CAMPAIGN"]  # allow-listed variables only
    assert "hf_do_not_leak_42" not in paths.rank_result(0).read_text()
    assert "hf_do_not_leak_42" not in paths.environment(host).read_text()
    hist = load(paths.log_history)
    assert [h["step"] for h in hist if "loss" in h] == [1, 2, 3, 4]


def test_lora_fsdp_v2_two_processes(tmp_path, inventory, host, tiny_model, small_data):
    (paths,) = render(tmp_path, inventory, tiny_model, small_data, experiment="finetune_lora_benchmark-v1.0.0",
                      entity={"number_gpus": 2, "batch_size": 4, "max_steps": 3, "distributed_backend": "FSDP"})
    assert yaml.safe_load(paths.accelerate.read_text().split("\n", 3)[-1])["fsdp_config"]["fsdp_version"] == 2
    proc = launch(paths, host)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = check_common(paths, host, [0, 1])
    for r in res["ranks"]:
        d = r["distributed"]
        assert d["distributed_type"] == "FSDP" and d["fsdp_version"] == 2 and "gloo" in d["backend"]
        assert d["sharded_parameters"] == d["parameters_tensors"] > 0  # fully_shard really ran
        assert r["world_size"] == 2 and r["global_step"] == 3
        m = r["metrics"]
        assert m["rank_train_samples"] == 6 and m["train_samples"] == 12  # per-device batch 2 x 3 steps x 2
        assert m["dataset_tokens"] == m["run_train_tokens"] == 2 * m["train_tokens"] == 12 * 96
        assert m["dataset_tokens_per_second_per_gpu"] == pytest.approx(m["dataset_tokens_per_second"] / 2)
        assert 0 < r["model"]["trainable_parameters"] < r["model"]["parameters"]
    # rank 0 counts tokens (or reads the cache) first; rank 1 then finds the counts cached
    r0, r1 = res["ranks"]
    assert r1["dataset_token_counts"]["cache"] == "hit"
    assert r0["dataset_token_counts"]["key"] == r1["dataset_token_counts"]["key"]
    assert Path(r1["dataset_token_counts"]["cache_dir"]).parent == small_data


def test_ddp_is_rendered_as_a_launchable_multi_process_config(tmp_path, inventory, host, tiny_model, small_data):
    """accelerate starts MULTI_CPU configs with its single-process launcher; CPU DDP must use MULTI_GPU + use_cpu."""
    (paths,) = render(tmp_path, inventory, tiny_model, small_data, experiment="finetune_lora_benchmark-v1.0.0",
                      entity={"number_gpus": 2, "batch_size": 4, "max_steps": 2, "distributed_backend": "DDP"})
    cfg = yaml.safe_load(paths.accelerate.read_text())
    assert cfg["distributed_type"] == "MULTI_GPU" and cfg["use_cpu"] is True


@pytest.mark.slow(15)
def test_lora_ddp_two_processes_auto_stop_agrees_across_ranks(tmp_path, inventory, host, tiny_model, small_data):
    (paths,) = render(tmp_path, inventory, tiny_model, small_data, experiment="finetune_lora_benchmark-v1.0.0",
                      entity={"number_gpus": 2, "batch_size": 4, "max_steps": 2000, "distributed_backend": "DDP",
                              "auto_stop_method": AUTO},
                      runner={"auto_stop": {"warmup_seconds": 2, "stable_seconds": 2, "min_steps": 3}})
    proc = launch(paths, host)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = check_common(paths, host, [0, 1])
    r0, r1 = res["ranks"]
    for r in (r0, r1):
        assert r["distributed"]["wrapped_class"] == "DistributedDataParallel"
        assert r["distributed"]["distributed_type"] == "MULTI_CPU" and "gloo" in r["distributed"]["backend"]
        assert r["stopped_by"] == "auto_stop" and r["window"] == "after_warmup"
        assert r["global_step"] < 2000
        # rank 0 decides on its own clock; the other ranks time the same steps on theirs
        slack = 0 if r["rank"] == 0 else 0.5
        assert r["warmup_end_wall"] - r["train_start_wall"] >= 2 - slack
        assert r["train_end_wall"] - r["warmup_end_wall"] >= 2 - slack
        m, tot = r["metrics"], r["totals"]
        assert m["train_steps"] >= 3 and m["train_steps"] < r["global_step"]  # warm-up steps excluded
        assert abs(m["train_runtime"] - (r["train_end_wall"] - r["warmup_end_wall"])) < 0.2
        assert m["rank_train_samples"] == 2 * m["train_steps"] < tot["rank_samples"]
        assert m["train_samples"] == 4 * m["train_steps"]  # both ranks' samples
        assert m["rank_dataset_tokens"] < tot["rank_dataset_tokens"]
    # rank 0 decided, rank 1 followed: same steps, same warm-up end step
    assert r0["global_step"] == r1["global_step"]
    assert r0["totals"]["steps"] - r0["metrics"]["train_steps"] == r1["totals"]["steps"] - r1["metrics"]["train_steps"]
    # collect can cut the samples to the measured window
    inside = [s for s in samples(paths, host)
              if res["training"]["warmup_end_wall"] <= float(s["t_wall"]) <= res["training"]["train_end_wall"]]
    assert len(inside) >= 3


def test_prompt_tuning_single_process_stop_after_seconds(tmp_path, inventory, host, tiny_model, small_data):
    (paths,) = render(tmp_path, inventory, tiny_model, small_data, experiment="finetune_pt_benchmark-v1.0.0",
                      entity={"number_gpus": 1, "batch_size": 2, "max_steps": 5000, "stop_after_seconds": 2.0},
                      runner={"token_cache": False})
    proc = launch(paths, host)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = check_common(paths, host, [0])
    r = res["ranks"][0]
    assert r["model"]["peft_method"] == "pt" and r["model"]["trainable_parameters"] == 20 * 64  # 20 virtual tokens
    assert r["stopped_by"] == "stop_after_seconds" and 1 <= r["global_step"] < 5000
    assert r["train_end_wall"] - r["train_start_wall"] >= 2.0
    assert r["warmup_end_wall"] is None and r["window"] == "whole_run"
    assert r["dataset_token_counts"]["cache"] == "off" and r["dataset_token_counts"]["cache_dir"] is None


# -- exact dataset tokens ----------------------------------------------------------------------

def test_dataset_tokens_over_a_full_epoch_match_an_independent_recount(tmp_path, inventory, host, tiny_model):
    from transformers import AutoTokenizer

    gen = tmp_path / "gen.jsonl"
    from harness.data.datagen import generate_dataset

    generate_dataset(DATASET, gen, entries=22)
    rng = random.Random(7)
    texts = []
    mid = "\n\n### Response:\n"
    for line in gen.read_text().splitlines():
        head, response = json.loads(line)["output"].split(mid)
        # Inputs and responses cut at random: from ~40 to 400+ tokens, so some entries are truncated
        # at max_seq_length and the others padded in their batch.
        texts.append(head[:rng.randint(60, len(head))] + mid + response[:rng.randint(5, len(response))])
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / f"{DATASET}.jsonl").write_text("".join(json.dumps({"output": t}) + "\n" for t in texts))
    (paths,) = render(tmp_path, inventory, tiny_model, data_dir, experiment="finetune_lora_benchmark-v1.0.0",
                      entity={"number_gpus": 1, "batch_size": 4, "model_max_length": 200})
    proc = launch(paths, host)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = check_common(paths, host, [0])
    r = res["ranks"][0]
    tok = AutoTokenizer.from_pretrained(tiny_model)
    per_entry = [min(len(tok(t)["input_ids"]), tok.model_max_length, 200) for t in texts]
    assert min(per_entry) < 200 and max(per_entry) == 200  # the recount covers both cases
    assert r["stopped_by"] == "epochs" and r["global_step"] == 6  # 22 entries, batches of 4
    assert r["metrics"]["train_samples"] == 22
    assert r["metrics"]["dataset_tokens"] == sum(per_entry)
    assert r["dataset_token_counts"]["total"] == sum(per_entry)
    assert r["dataset_token_counts"]["entries"] == 22
    assert r["metrics"]["train_tokens"] > r["metrics"]["dataset_tokens"]  # padding counted there only
    assert r["dataset_token_counts"]["matches_training_data"] is True


# -- failures ---------------------------------------------------------------------------------

def test_optimizer_that_cannot_run_here_is_failed(tmp_path, inventory, host, tiny_model, small_data):
    # The nodes run their own python (partition python:), so plan can only note that schedulefree may be
    # missing there; the trainer then fails to build the optimizer, and the run says why.
    part = next(iter(inventory.partitions.values()))
    nodes_python = dataclasses.replace(inventory,
                                       partitions={part.name: dataclasses.replace(part, python=sys.executable)})
    (paths,) = render(tmp_path, nodes_python, tiny_model, small_data, experiment="finetune_full_benchmark-v1.0.0",
                      entity={"number_gpus": 1, "batch_size": 2, "max_steps": 2, "optim": "schedule_free_adamw"})
    proc = launch(paths, host)
    assert proc.returncode == 1
    res = load(paths.result(host))
    err = load(paths.error(0))
    assert res["outcome"] == "failed" and err["kind"] == "failed"
    assert err["error_type"] == "ImportError" and "schedulefree" in err["message"]
    assert err["rank"] == 0 and err["host"] == host and err["stage"] == "train" and "Traceback" in err["traceback"]
    assert "ImportError" in res["reason"]
    end = [e for e in read_stages(paths.stages(host)) if e["rank"] == 0 and e["event"] == "end"][-1]
    assert end["stage"] == "train" and end["status"] == "error"


def _direct(tmp_path: Path, tiny_model: Path, small_data: Path,
            *extra: str) -> tuple[subprocess.CompletedProcess, JobPaths]:
    jd = tmp_path / "direct"
    argv = [sys.executable, "-m", "harness.runner.train", "--model_name_or_path", str(tiny_model),
            "--training_data_path", str(small_data / f"{DATASET}.jsonl"), "--output_dir", str(jd / "output"),
            "--max_seq_length", "64", "--max_steps", "2", "--per_device_train_batch_size", "2",
            "--job_dir", str(jd), *extra]
    env = {**os.environ, "SBENCH_HOST": "h0", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300), JobPaths(jd)


def test_nonsense_optimizer_direct(tmp_path, tiny_model, small_data):
    proc, paths = _direct(tmp_path, tiny_model, small_data, "--optim", "nonsense")
    assert proc.returncode == 1
    err = load(paths.error(0))
    assert err["kind"] == "failed" and err["error_type"] == "ValueError" and "nonsense" in err["message"]
    assert load(paths.rank_result(0))["status"] == "error"


def test_gptq_on_cpu_fails_with_a_clear_reason(tmp_path, tiny_model, small_data):
    proc, paths = _direct(tmp_path, tiny_model, small_data, "--peft_method", "lora", "--target_modules", "q_proj",
                          "--auto_gptq", "triton_v2", "--fp16", "true", "--fused_lora", "auto_gptq", "true")
    assert proc.returncode == 1
    err = load(paths.error(0))
    assert err["kind"] == "failed" and err["error_type"].endswith("TrainerSetupError")
    assert "needs a CUDA GPU" in err["message"]


def test_qlora_on_cpu_fails_with_a_clear_reason_and_builds_nf4_where_it_runs(tmp_path, tiny_model, small_data):
    """Plan marks use_qlora invalid on CPU partitions; a hand-made command still fails clearly, not deep in
    bitsandbytes. Where CUDA is, the weights load through transformers' BitsAndBytesConfig as NF4."""
    import argparse

    import torch

    from harness.runner.train import qlora_kwargs

    proc, paths = _direct(tmp_path, tiny_model, small_data, "--peft_method", "lora", "--target_modules", "q_proj",
                          "--use_qlora", "true")
    assert proc.returncode == 1
    err = load(paths.error(0))
    assert err["error_type"].endswith("TrainerSetupError") and "no CUDA device" in err["message"]
    q = qlora_kwargs(argparse.Namespace(use_qlora=True), torch.bfloat16)["quantization_config"]
    assert (q.load_in_4bit, q.bnb_4bit_quant_type, q.bnb_4bit_use_double_quant) == (True, "nf4", True)
    assert q.bnb_4bit_compute_dtype == q.bnb_4bit_quant_storage == torch.bfloat16
    assert qlora_kwargs(argparse.Namespace(use_qlora=False), torch.bfloat16) == {}


def test_vision_dataset_without_its_image_field_fails_with_a_clear_reason(tmp_path, tiny_model, small_data):
    proc, paths = _direct(tmp_path, tiny_model, small_data, "--training_data_path", str(tmp_path / "v.parquet"))
    assert proc.returncode == 1
    err = load(paths.error(0))
    # refused before any data stage: the failure is the launch stage's, and that stage is closed with it
    assert err["kind"] == "failed" and "--dataset_image_field" in err["message"] and err["stage"] == "launch"
    (end,) = [e for e in read_stages(paths.stages(err["host"])) if e["stage"] == "launch" and e["event"] == "end"]
    assert end["status"] == "error" and "vision" in end["error"]


def test_unknown_flag_is_an_error(tmp_path, tiny_model, small_data):
    proc, _ = _direct(tmp_path, tiny_model, small_data, "--not_a_flag", "1")
    assert proc.returncode == 2 and "unrecognized arguments: --not_a_flag" in proc.stderr


def test_injected_oom_is_invalid(tmp_path, inventory, host, tiny_model, small_data):
    (paths,) = render(tmp_path, inventory, tiny_model, small_data, experiment="finetune_full_benchmark-v1.0.0",
                      entity={"number_gpus": 1, "batch_size": 2, "max_steps": 4})
    proc = launch(paths, host, env={"SBENCH_FAULT": "oom@step=1"})
    assert proc.returncode == 2
    res, err = load(paths.result(host)), load(paths.error(0))
    assert res["outcome"] == "invalid" and "OutOfMemoryError" in res["reason"]
    assert err["kind"] == "invalid" and err["error_type"] == "torch.OutOfMemoryError" and err["stage"] == "train"
    hist = load(paths.log_history) if paths.log_history.exists() else []
    assert all(h.get("step", 0) <= 1 for h in hist)


def test_scancel_sigterm_stops_training_and_records_it(tmp_path, inventory, host, tiny_model, small_data):
    (paths,) = render(tmp_path, inventory, tiny_model, small_data, experiment="finetune_full_benchmark-v1.0.0",
                      entity={"number_gpus": 1, "batch_size": 2, "max_steps": 6})
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update({"SBENCH_HOST": host, "HF_HUB_OFFLINE": "1", "SBENCH_FAULT": "sleep@step=1:600"})
    p = subprocess.Popen(["bash", str(paths.launch)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline:
        if paths.stages(host).exists() and any(e["stage"] == "train" and e["rank"] == 0
                                               for e in read_stages(paths.stages(host))):
            break
        time.sleep(0.2)
    time.sleep(2)  # inside step 1's sleep
    p.send_signal(signal.SIGTERM)  # launch.sh exec'd the node runner: this is what scancel hits
    assert p.wait(timeout=60) == 128 + signal.SIGTERM
    res = load(paths.result(host))
    assert res["outcome"] == "failed" and res["terminated_by"] == signal.SIGTERM
    assert res["ranks"][0]["status"] == "killed"
    end = [e for e in read_stages(paths.stages(host)) if e["stage"] == "train" and e["event"] == "end"]
    assert end and end[0]["status"] == "killed"


def test_deepspeed_is_imported_only_where_the_launch_is_deepspeeds(monkeypatch) -> None:
    """accelerate imports DeepSpeed to unwrap any model where it is installed; the sbench trainer switches that off
    unless accelerate launched DeepSpeed (ACCELERATE_USE_DEEPSPEED)."""
    import accelerate.utils.other as other

    from harness.runner.train import deepspeed_left_out

    monkeypatch.setattr(other, "is_deepspeed_available", lambda: True)  # (put back after the test)
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    assert deepspeed_left_out() is False and other.is_deepspeed_available() is True
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED")
    assert deepspeed_left_out() is True and other.is_deepspeed_available() is False


def test_activation_checkpointing_goes_by_the_name_the_trainer_arguments_have() -> None:
    # transformers 5.2x renamed gradient_checkpointing to activation_checkpointing; earlier 5.x releases know only
    # the old name, and an unknown keyword fails every point
    from harness.runner.train import checkpointing_args

    @dataclasses.dataclass
    class Old:
        gradient_checkpointing: bool = False
        gradient_checkpointing_kwargs: Any = None

    @dataclasses.dataclass
    class New(Old):
        activation_checkpointing: bool = False
        activation_checkpointing_kwargs: Any = None

    kw = {"use_reentrant": False}
    assert checkpointing_args(Old, True, kw) == {"gradient_checkpointing": True, "gradient_checkpointing_kwargs": kw}
    assert checkpointing_args(New, False, None) == {"activation_checkpointing": False,
                                                    "activation_checkpointing_kwargs": None}
    Old(**checkpointing_args(Old, True, kw))  # accepted by the class it was made for
    New(**checkpointing_args(New, True, kw))


def test_triton_that_cannot_build_turns_trl_to_its_torch_loss(monkeypatch, tmp_path: Path) -> None:
    # On CUDA trl's loss runs Triton kernels, whose launcher Triton compiles with a C compiler against the python
    # headers; where neither is there every step would fail, so the trainer switches trl to its torch tiles.
    import importlib.util

    import torch
    import trl.kernels.chunked_logprob as chunked
    import trl.trainer.utils as trl_utils

    from harness.runner import devices
    from harness.runner.train import trl_triton_off

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "triton" else real(name, *a))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CC", raising=False)
    assert "no C compiler" in (devices.triton_build_problem() or "")
    cc = tmp_path / "mycc"
    cc.write_text("#!/bin/sh\n")
    cc.chmod(0o755)
    monkeypatch.setenv("CC", f"{cc} -O2")
    assert "no C compiler" not in (devices.triton_build_problem() or "")
    monkeypatch.setattr(importlib.util, "find_spec", real)
    assert devices.triton_build_problem() is None or importlib.util.find_spec("triton") is not None

    monkeypatch.setattr(chunked, "_TRITON_AVAILABLE", True)
    monkeypatch.setattr(trl_utils, "is_triton_available", lambda: True)
    assert chunked._use_triton(torch.device("cuda")) is True
    assert trl_triton_off() is True
    assert chunked._use_triton(torch.device("cuda")) is False and trl_utils.is_triton_available() is False


def test_a_flash_attn_that_does_not_load_is_not_asked_for(monkeypatch, tmp_path: Path) -> None:
    # A flash_attn built for another torch is found but fails to load: the trainer runs sdpa and says why.
    import sys

    from harness.runner.devices import flash_attn_problem, what_ran

    assert flash_attn_problem() == "the flash_attn package is not installed in the trainer's python"
    (tmp_path / "flash_attn").mkdir()
    (tmp_path / "flash_attn" / "__init__.py").write_text("raise ImportError('undefined symbol: _ZN3c10')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "flash_attn", raising=False)
    problem = flash_attn_problem()
    assert problem == "the flash_attn package does not load (ImportError: undefined symbol: _ZN3c10)"

    class Model:
        class config:  # noqa: N801 - stands for a model's config
            _attn_implementation = "sdpa"

        def parameters(self):
            return iter(())

    _, adjustments = what_ran({"attn_implementation": "flash_attention_2"}, Model(), False, False, cuda=True)
    assert adjustments == [{"setting": "attn_implementation", "asked": "flash_attention_2", "used": "sdpa",
                            "why": problem}]
