"""The fms-hf-tuning trainer: plan rules, the rendered command line, its environment, and real runs.

The real runs use the fms-hf-tuning 3.2.2 environment that `make test` builds (cached in
~/.cache/sbench/envs, or $SBENCH_ENVS_DIR), on the tiny model on this machine's CPU, through the
local executor; their measurements are recomputed here from the raw files and the dataset.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.contract.paths import JobPaths

from . import kit
from .kit import SMALL_DATASET, sql_rows, write_yaml

VERSION = "3.2.2"


# -- plan and render (no environment needed: plan reads what sbench-env.json says) --------------------
def _fake_env(root: Path, version: str = VERSION, plugins: dict | None = None, packages: dict | None = None) -> None:
    d = root / f"fms-hf-tuning-{version}"
    (d / "bin").mkdir(parents=True)
    (d / "sbench-env.json").write_text(json.dumps({
        "package": "fms-hf-tuning", "version": version, "plugins": plugins or {},
        "packages": packages or {"fms-hf-tuning": version}, "trainer_packages": {"fms-hf-tuning": version},
        "torch": {"version": "2.8.0", "cuda": "12.8"}}))


def _inventory(tmp_path: Path, envs: Path) -> Path:
    return write_yaml(tmp_path / "inv.yaml", {
        "cluster": "c", "defaults": {"envs_dir": str(envs)},
        "partitions": {
            "gpu": {"gpu_model": "NVIDIA-A100-SXM4-80GB", "gpus_per_node": 8, "cpus_per_node": 64, "memory_gb": 512,
                    "hosts": {"g1": {"address": "10.0.0.1"}}},
            "cpu": {"gpu_model": "cpu", "gpus_per_node": 2, "cpus_per_node": 4, "memory_gb": 16,
                    "hosts": {"c1": {"address": "127.0.0.1"}}}}})


def _plan(cli, tmp_path: Path, inv: Path, name: str, doc: dict) -> list[dict]:
    sweep = write_yaml(tmp_path / f"{name}.yaml", {"campaign": name, **doc})
    res = cli("plan", sweep, "-i", inv, "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def _by_trainer(points: list[dict]) -> dict[str, dict]:
    return {p["entity"]["trainer"]: p for p in points}


def test_gptq_lora_is_valid_only_with_fms_on_cuda_with_its_plugins(cli, tmp_path) -> None:
    envs = tmp_path / "envs"
    _fake_env(envs, plugins={"fms-acceleration-peft": "0.4.4", "fms-acceleration-foak": "0.7.4"})
    inv = _inventory(tmp_path, envs)
    doc = {"experiment": "finetune_gtpq-lora_benchmark-v1.0.0",
           "entity": {"model_name": "granite-8b-code-instruct", "model_max_length": 512, "number_gpus": 2,
                      "batch_size": 4, "fms_hf_tuning_version": VERSION},
           "grid": {"trainer": ["sbench", "fms-hf-tuning"]}}
    gpu = _by_trainer(_plan(cli, tmp_path, inv, "g", {**doc, "partition": "gpu"}))
    assert gpu["fms-hf-tuning"]["valid"] is True, gpu["fms-hf-tuning"]["reasons"]
    assert gpu["sbench"]["valid"] is False
    assert any("only the fms-hf-tuning trainer loads" in r for r in gpu["sbench"]["reasons"])
    cpu = _by_trainer(_plan(cli, tmp_path, inv, "c", {**doc, "partition": "cpu"}))
    assert not cpu["fms-hf-tuning"]["valid"] and not cpu["sbench"]["valid"]
    assert any("CPU partition" in r for r in cpu["fms-hf-tuning"]["reasons"])
    # The spelling users type reaches the reference's "gtpq" experiment.
    alias = _plan(cli, tmp_path, inv, "a", {**doc, "partition": "gpu",
                                             "experiment": "finetune_gptq-lora_benchmark-v1.0.0"})
    assert {p["experiment"] for p in alias} == {"finetune_gtpq-lora_benchmark-v1.0.0"}


def test_plan_says_what_the_environment_lacks_or_why_it_failed(cli, tmp_path) -> None:
    envs = tmp_path / "envs"
    _fake_env(envs)  # built without the plugins
    inv = _inventory(tmp_path, envs)
    base = {"experiment": "finetune_full_benchmark-v1.0.0", "partition": "gpu",
            "entity": {"model_name": "mixtral-8x7b-instruct-v0.1", "model_max_length": 512, "number_gpus": 4,
                       "batch_size": 4, "fast_moe": 2, "trainer": "fms-hf-tuning"}}
    (p,) = _plan(cli, tmp_path, inv, "moe", {**base, "entity": {**base["entity"], "fms_hf_tuning_version": VERSION}})
    assert p["valid"] and any("lacks fms-acceleration-moe" in n for n in p["notes"])
    (old,) = _plan(cli, tmp_path, inv, "old", base)  # the default release, 2.1.2, predates fast_moe
    assert not old["valid"] and any("2.4.0 or later" in r for r in old["reasons"])
    (envs / "fms-hf-tuning-9.9.9.failed.json").write_text(json.dumps(
        {"version": "9.9.9", "extras": [], "reason": "No matching distribution found for fms-hf-tuning==9.9.9"}))
    (bad,) = _plan(cli, tmp_path, inv, "bad", {**base, "entity": {**base["entity"], "fast_moe": 0,
                                                                  "fms_hf_tuning_version": "9.9.9"}})
    assert not bad["valid"] and any("No matching distribution" in r and "sbench env build fms-hf-tuning==9.9.9" in r
                                    for r in bad["reasons"])
    (sb,) = _plan(cli, tmp_path, inv, "fk", {**base, "entity": {**base["entity"], "fast_moe": 0, "trainer": "sbench",
                                                                "fast_kernels": [True, True, True]}})
    assert not sb["valid"] and any("fast_kernels" in r for r in sb["reasons"])


VISION_ID = "vision-384x384-16384plus-entries-4096"


@pytest.mark.parametrize("partition", ["gpu", "cpu"])
def test_vision_points_are_valid_with_a_vision_model_and_invalid_with_a_text_model(cli, tmp_path, partition) -> None:
    envs = tmp_path / "envs"
    _fake_env(envs)
    inv = _inventory(tmp_path, envs)
    for exp in ("finetune_lora_benchmark-v1.0.0", "finetune_full_benchmark-v1.0.0"):
        points = _plan(cli, tmp_path, inv, "v", {
            "experiment": exp, "partition": partition,
            "entity": {"model_name": "granite-vision-3.2-2b", "model_max_length": 512, "number_gpus": 1,
                       "batch_size": 1, "dataset_id": VISION_ID, "fms_hf_tuning_version": VERSION},
            "grid": {"trainer": ["sbench", "fms-hf-tuning"]}})
        assert len(points) == 2
        for p in points:
            assert p["valid"], (exp, p["reasons"])
        if exp.startswith("finetune_lora"):
            sb = _by_trainer(points)["sbench"]
            assert any("q_proj, v_proj of the language model only" in n for n in sb["notes"])
    text = _plan(cli, tmp_path, inv, "t", {
        "experiment": "finetune_lora_benchmark-v1.0.0", "partition": partition,
        "entity": {"model_name": "llama3-8b", "model_max_length": 512, "number_gpus": 1, "batch_size": 1,
                   "dataset_id": VISION_ID}})
    assert not text[0]["valid"]
    assert any("vision (image + text) dataset and llama3-8b is a text model" in r for r in text[0]["reasons"])
    # A vision-language model with a text dataset: its processor needs images.
    (vt,) = _plan(cli, tmp_path, inv, "vt", {
        "experiment": "finetune_full_benchmark-v1.0.0", "partition": partition,
        "entity": {"model_name": "llava-v1.6-mistral-7b", "model_max_length": 512, "number_gpus": 1,
                   "batch_size": 1, "dataset_id": "news-chars-512-entries-4096"}})
    assert not vt["valid"] and any("is a text dataset" in r for r in vt["reasons"])
    # Prompt tuning: the fms-hf-tuning trainer runs the seed's line; the sbench trainer refuses with the reason.
    pt = _by_trainer(_plan(cli, tmp_path, inv, "pt", {
        "experiment": "finetune_pt_benchmark-v1.0.0", "partition": partition,
        "entity": {"model_name": "granite-vision-3.2-2b", "model_max_length": 512, "number_gpus": 1,
                   "batch_size": 1, "dataset_id": VISION_ID, "fms_hf_tuning_version": VERSION},
        "grid": {"trainer": ["sbench", "fms-hf-tuning"]}}))
    assert pt["fms-hf-tuning"]["valid"], pt["fms-hf-tuning"]["reasons"]
    assert not pt["sbench"]["valid"] and any("prompt tuning of a vision-language model" in r
                                             for r in pt["sbench"]["reasons"])
    # fms-hf-tuning releases before 2.8.0 have no vision path.
    (old,) = _plan(cli, tmp_path, inv, "old", {
        "experiment": "finetune_lora_benchmark-v1.0.0", "partition": partition,
        "entity": {"model_name": "granite-vision-3.2-2b", "model_max_length": 512, "number_gpus": 1,
                   "batch_size": 1, "dataset_id": VISION_ID, "trainer": "fms-hf-tuning",
                   "fms_hf_tuning_version": "2.1.2"}})
    assert not old["valid"] and any("from 2.8.0" in r for r in old["reasons"])
    # A vision point that names no release runs the first one sbench tunes vision with, not the seed's
    # default (2.1.2), and says so; a text point keeps the seed's default.
    unnamed = _by_trainer(_plan(cli, tmp_path, inv, "unnamed", {
        "experiment": "finetune_lora_benchmark-v1.0.0", "partition": partition,
        "entity": {"model_name": "granite-vision-3.2-2b", "model_max_length": 512, "number_gpus": 1,
                   "batch_size": 1, "dataset_id": VISION_ID},
        "grid": {"trainer": ["sbench", "fms-hf-tuning"]}}))
    fms = unnamed["fms-hf-tuning"]
    assert fms["valid"], fms["reasons"]
    assert fms["entity"]["fms_hf_tuning_version"] == VERSION
    assert any(f"fms_hf_tuning_version {VERSION}: the default release (2.1.2)" in n for n in fms["notes"])
    assert unnamed["sbench"]["entity"]["fms_hf_tuning_version"] == "2.1.2"
    (text_fms,) = _plan(cli, tmp_path, inv, "textfms", {
        "experiment": "finetune_lora_benchmark-v1.0.0", "partition": partition,
        "entity": {"model_name": "llama3-8b", "model_max_length": 512, "number_gpus": 1, "batch_size": 1,
                   "dataset_id": "news-chars-512-entries-4096", "trainer": "fms-hf-tuning"}})
    assert text_fms["entity"]["fms_hf_tuning_version"] == "2.1.2"


def test_a_local_model_is_told_vision_or_text_from_its_config(cli, tmp_path) -> None:
    inv = _inventory(tmp_path, tmp_path / "envs")
    vision, text = tmp_path / "vlm", tmp_path / "lm"
    vision.mkdir()
    text.mkdir()
    (vision / "config.json").write_text(json.dumps({
        "architectures": ["MyVisionForConditionalGeneration"], "model_type": "my_vlm",
        "vision_config": {"hidden_size": 8}, "text_config": {"model_type": "llama", "hidden_size": 8}}))
    (text / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    points = _plan(cli, tmp_path, inv, "local", {
        "experiment": "finetune_lora_benchmark-v1.0.0", "partition": "cpu",
        "model_map": {"vlm": str(vision), "lm": str(text)},
        "entity": {"model_max_length": 64, "number_gpus": 1, "batch_size": 1, "dataset_id": VISION_ID},
        "grid": {"model_name": ["vlm", "lm"]}})
    by = {p["entity"]["model_name"]: p for p in points}
    assert by["vlm"]["valid"], by["vlm"]["reasons"]
    assert not by["lm"]["valid"] and any(f"from {text}/config.json" in r for r in by["lm"]["reasons"])


@pytest.mark.parametrize("key,value", [("trainer", "fms"), ("trainer", ["sbench"]),
                                       ("fms_hf_tuning_version", "3.2.2; rm -rf /"),
                                       ("fms_hf_tuning_version", "latest")])
def test_bad_trainer_keys_are_input_errors(cli, tmp_path, key, value) -> None:
    sweep = write_yaml(tmp_path / "s.yaml", {
        "campaign": "bad", "experiment": "finetune_lora_benchmark-v1.0.0",
        "entity": {"model_name": "smollm2-135m", "model_max_length": 64, "number_gpus": 1, "batch_size": 1,
                   key: value}})
    res = cli("plan", sweep)
    assert res.exit_code == 2 and key in res.output and "Traceback" not in res.output


def test_render_shows_the_reference_command_line_and_its_environment(cli, tmp_path) -> None:
    envs = tmp_path / "envs"
    _fake_env(envs, packages={"fms-hf-tuning": VERSION, "flash-attn": "2.8.3"})
    inv = _inventory(tmp_path, envs)
    out = tmp_path / "preview"
    for exp, part, name in (("finetune_pt_benchmark-v1.0.0", "cpu", "pt"),
                            ("finetune_lora_benchmark-v1.0.0", "gpu", "lora")):
        sweep = write_yaml(tmp_path / f"{name}.yaml", {
            "campaign": name, "experiment": exp, "partition": part,
            "entity": {"model_name": "smollm2-135m", "model_max_length": 64, "number_gpus": 2, "batch_size": 4,
                       "trainer": "fms-hf-tuning", "fms_hf_tuning_version": VERSION}})
        res = cli("render", sweep, "-i", inv, "-o", out / name)
        assert res.exit_code == 0, res.output
        (job,) = [d for d in (out / name).iterdir() if d.is_dir()]
        launch = (job / "launch.sh").read_text()
        py = envs / f"fms-hf-tuning-{VERSION}" / "bin" / "python"
        assert f"TPY={py}" in launch and '"$TPY" -m accelerate.commands.launch' in launch
        assert "-m harness.runner.fms" in launch and f"export PYTHONPATH={job / 'pythonpath'}" in launch
        link = job / "pythonpath" / "harness"
        assert link.is_symlink() and (link / "runner" / "fms.py").is_file()
        assert sorted(p.name for p in (job / "pythonpath").iterdir()) == ["harness"]  # nothing else shadows
        spec = json.loads((job / "spec.json").read_text())["jobspec"]
        argv = spec["train_argv"]
        assert spec["trainer"] == "fms-hf-tuning" and spec["trainer_env"]["version"] == VERSION
        assert "--fast_moe" not in argv  # 0 would switch ScatterMoE on in this release
        if name == "pt":
            # the seed's prompt-tuning command line, as written
            assert argv[argv.index("--peft_method") + 1] == "none" and "--num_virtual_tokens" not in argv
            assert argv[argv.index("--use_cpu") + 1] == "True"
            assert argv[argv.index("--torch_dtype") + 1] == "float32"
        else:
            assert argv[argv.index("--peft_method") + 1] == "lora"
            assert argv[argv.index("--use_flash_attn") + 1] == "True" and "--use_cpu" not in argv
            assert argv[argv.index("--torch_dtype") + 1] == "bfloat16"


def test_render_of_a_vision_point_names_the_image_and_text_fields(cli, tmp_path) -> None:
    envs = tmp_path / "envs"
    _fake_env(envs)
    inv = _inventory(tmp_path, envs)
    sweep = write_yaml(tmp_path / "v.yaml", {
        "campaign": "v", "experiment": "finetune_lora_benchmark-v1.0.0", "partition": "gpu",
        "entity": {"model_name": "granite-vision-3.2-2b", "model_max_length": 4096, "number_gpus": 1,
                   "batch_size": 1, "dataset_id": VISION_ID, "fms_hf_tuning_version": VERSION},
        "grid": {"trainer": ["sbench", "fms-hf-tuning"]}})
    res = cli("render", sweep, "-i", inv, "-o", tmp_path / "out")
    assert res.exit_code == 0, res.output
    jobs = [d for d in (tmp_path / "out").iterdir() if d.is_dir()]
    assert len(jobs) == 2
    for job in jobs:
        argv = json.loads((job / "spec.json").read_text())["jobspec"]["train_argv"]
        assert argv[argv.index("--dataset_image_field") + 1] == "images"
        assert argv[argv.index("--dataset_text_field") + 1] == "output"
        assert argv[argv.index("--remove_unused_columns") + 1] == "False"
        assert argv[argv.index("--target_modules") + 1:argv.index("--target_modules") + 3] == ["q_proj", "v_proj"]
        assert argv[argv.index("--training_data_path") + 1].endswith(f"{VISION_ID}.parquet")
        assert "--dataset_image_field images" in (job / "launch.sh").read_text()


def test_env_build_of_a_release_that_does_not_exist_fails_with_pips_reason(cli, tmp_path) -> None:
    bad = cli("env", "build", "fms-hf-tuning==0.0.0.1", "--root", tmp_path / "envs")
    assert bad.exit_code == 1 and "fms-hf-tuning==0.0.0.1 could not be built" in bad.output
    failed = json.loads((tmp_path / "envs" / "fms-hf-tuning-0.0.0.1.failed.json").read_text())
    assert "fms-hf-tuning==0.0.0.1" in failed["reason"] or "No matching distribution" in failed["reason"]
    assert not (tmp_path / "envs" / "fms-hf-tuning-0.0.0.1").exists()
    assert not [p for p in (tmp_path / "envs").iterdir() if ".tmp-" in p.name]
    res = cli("env", "list", "--root", tmp_path / "envs")
    assert res.exit_code == 0 and "last build failed" in res.output
    assert cli("env", "build", "torch==2.8.0").exit_code == 2


# -- real runs ----------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def fms_env():
    """The 3.2.2 environment `make test` builds (built here if it is missing)."""
    from harness.data.trainerenv import build
    from harness.spec.envs import envs_root

    env, _ = build(VERSION, envs_root(None), extras=("fms-accel",))
    return env


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model, small_data_dir, fms_env, cli_module):
    cli = cli_module
    """Full, LoRA and prompt tuning through both trainers, and LoRA with 2 processes (DDP and FSDP) through
    fms-hf-tuning (the sbench trainer's are test_e2e_local's), one epoch of the 64-entry dataset each, through the
    local executor; then one collect."""
    root = tmp_path_factory.mktemp("fms")
    env = {"root": root, "workdir": root / "runs", "db": root / "r.duckdb", "data": small_data_dir}
    common = {"model_name": "tiny", "model_max_length": 512, "dataset_id": SMALL_DATASET, "batch_size": 4,
              "gradient_accumulation_steps": 2, "fms_hf_tuning_version": VERSION}
    both = {"trainer": ["sbench", "fms-hf-tuning"]}
    sweeps = [("fms-full", "finetune_full_benchmark-v1.0.0", {"number_gpus": 1}, both),
              ("fms-lora", "finetune_lora_benchmark-v1.0.0", {"number_gpus": 1}, both),
              ("fms-lora2", "finetune_lora_benchmark-v1.0.0", {"number_gpus": 2, "trainer": "fms-hf-tuning"},
               {"distributed_backend": ["DDP", "FSDP"]}),
              ("fms-pt", "finetune_pt_benchmark-v1.0.0", {"number_gpus": 1}, both)]
    for name, exp, entity, grid in sweeps:
        path = write_yaml(root / f"{name}.yaml", {
            "campaign": name, "experiment": exp, "entity": {**common, **entity},
            "grid": grid, "model_map": {"tiny": str(tiny_model)},
            "data_dir": str(small_data_dir), "runner": {"sample_interval_s": 0.05}})
        res = cli("submit", path, "--executor", "local", "--wait", "--workdir", env["workdir"], "--db", env["db"])
        assert res.exit_code == 0, res.output
    res = cli("collect", "--workdir", env["workdir"], "--db", env["db"])
    assert res.exit_code == 0, res.output
    return env


def _rows(env, where: str = "true") -> list[dict]:
    return sql_rows(env["db"], "SELECT m.*, r.job_dir, r.outcome, r.reason FROM measurements m JOIN runs r "
                               f"USING (run_id) WHERE {where} ORDER BY m.campaign, m.trainer, m.number_gpus, "
                               "m.distributed_backend")


@pytest.mark.train
@pytest.mark.slow(170)
def test_every_point_runs_through_both_trainers(runs) -> None:
    rows = _rows(runs)
    # full, LoRA and PT with 1 process through both trainers; LoRA with 2 (DDP, FSDP) through fms-hf-tuning
    assert len(rows) == 2 * (1 + 1 + 1) + 2
    assert all(r["outcome"] == "ok" and r["is_valid"] for r in rows), [(r["run_id"], r["reason"]) for r in rows]
    assert sorted({r["trainer"] for r in rows}) == ["fms-hf-tuning", "sbench"]
    points = sql_rows(runs["db"], "SELECT DISTINCT trainer FROM points")
    assert sorted(p["trainer"] for p in points) == ["fms-hf-tuning", "sbench"]
    for env_row in sql_rows(runs["db"], "SELECT e.*, m.trainer AS t FROM environment e JOIN measurements m "
                                        "USING (run_id)"):
        if env_row["t"] == "fms-hf-tuning":
            assert env_row["trainer"] == "fms-hf-tuning" and env_row["transformers"].startswith("4.55")
            assert env_row["trl"].startswith("0.19") and env_row["torch"].startswith("2.8")
            assert json.loads(env_row["trainer_packages"])["fms-hf-tuning"] == VERSION
        else:
            assert env_row["trainer"] == "sbench" and env_row["transformers"].startswith("5.")


@pytest.mark.train
def test_fms_measurements_agree_with_an_independent_recomputation(runs, tiny_model) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    entries = [json.loads(line)["output"] for line in (runs["data"] / f"{SMALL_DATASET}.jsonl").open()]
    # note 3: min(len(tokens(entry)), model_max_length, max_seq_length)
    note3 = [min(len(tok(e)["input_ids"]), 512) for e in entries]
    for m in _rows(runs, "m.trainer = 'fms-hf-tuning'"):
        paths = JobPaths(m["job_dir"])
        ranks = [json.loads(paths.rank_result(r).read_text()) for r in range(m["world_size"])]
        r0 = ranks[0]
        assert r0["trainer"]["packages"]["fms-hf-tuning"] == VERSION
        assert r0["meter"] == {"mismatches": 0, "unconsumed_batches": 0}
        assert not [n for n in r0["notes"] if "dataset tokens" in n]  # every row matched its entry
        # One epoch: 64 samples. fms-hf-tuning seeds each rank apart, so with 2 ranks an entry may be drawn
        # twice and another not at all; the rank files name the entries each rank's steps consumed.
        consumed = [i for r in ranks for i in r["entries_consumed"]]
        assert len(consumed) == len(entries) and min(consumed) >= 0
        if m["world_size"] == 1:
            assert sorted(consumed) == list(range(len(entries)))
        total = sum(note3[i] for i in consumed)
        met = r0["metrics"]
        assert met["train_samples"] == len(entries) and met["dataset_tokens"] == total
        assert sum(r["metrics"]["rank_dataset_tokens"] for r in ranks) == total
        runtime = r0["train_end_wall"] - r0["train_start_wall"]
        assert m["train_runtime"] == pytest.approx(runtime, rel=1e-3)
        assert m["dataset_tokens_per_second"] == pytest.approx(total / runtime, rel=1e-3)
        assert m["train_samples_per_second"] == pytest.approx(len(entries) / runtime, rel=1e-3)
        # the steps fms-hf-tuning logged are the steps sbench timed
        hist = json.loads(paths.log_history.read_text())
        assert max(h.get("step", 0) for h in hist) == r0["global_step"] == len(entries) // 4 // 2
        stages = [json.loads(line)["stage"] for line in paths.stages(r0["host"]).open()
                  if json.loads(line).get("rank") == 0 and json.loads(line)["event"] == "start"]
        assert stages == ["launch", "tokens", "model_load", "dataset", "trainer_init", "train"]
        dist = r0["distributed"]
        if m["world_size"] == 2:
            want = {"DDP": "MULTI_CPU", "FSDP": "FSDP"}[m["distributed_backend"]]
            assert dist["distributed_type"] == want
            if want == "FSDP":
                assert dist["sharded_parameters"] == dist["parameters_tensors"] > 0
        if m["experiment"].startswith("finetune_pt"):
            # --peft_method none, as the seed's prompt-tuning command line says: every weight trains
            assert r0["model"]["trainable_parameters"] == r0["model"]["parameters"]
            assert "--peft_method none" in " ".join(r0["argv"])
        if m["experiment"].startswith("finetune_lora"):
            assert 0 < r0["model"]["trainable_parameters"] < r0["model"]["parameters"] / 10


@pytest.mark.train
def test_both_trainers_record_what_ran(runs) -> None:
    """Every point asks bfloat16 (the default) and flash-attention, and this machine has no CUDA: both trainers
    record the float32 weights and sdpa attention the loaded model ran with, beside what was asked."""
    for m in _rows(runs):
        r0 = json.loads(JobPaths(m["job_dir"]).rank_result(0).read_text())
        assert r0["ran"]["torch_dtype"] == "float32", m["trainer"]
        assert (m["torch_dtype"], m["effective_torch_dtype"], m["attn_implementation"]) == \
            ("bfloat16", "float32", "sdpa"), m["trainer"]
        adj = {a["setting"]: a for a in json.loads(m["adjustments"])}
        assert adj["torch_dtype"] == {"setting": "torch_dtype", "asked": "bfloat16", "used": "float32",
                                      "why": "no CUDA device"}, m["trainer"]
        assert adj["attn_implementation"]["asked"] == "flash_attention_2"
        assert "torch_dtype bfloat16 -> float32: no CUDA device" in m["notes"]


@pytest.mark.train
def test_both_trainers_count_the_same_dataset_tokens(runs) -> None:
    """One process, one epoch: both trainers consume every entry once, and count exactly the same tokens."""
    rows = _rows(runs, "m.number_gpus = 1")
    by = {}
    for m in rows:
        r0 = json.loads(JobPaths(m["job_dir"]).rank_result(0).read_text())
        by.setdefault(m["experiment"], {})[m["trainer"]] = r0["metrics"]["dataset_tokens"]
    assert len(by) == 3
    for pair in by.values():
        assert pair["sbench"] == pair["fms-hf-tuning"]


@pytest.mark.train
def test_oom_inside_fms_hf_tuning_is_an_invalid_measurement(tmp_path, tiny_model, small_data_dir, fms_env, cli,
                                                            monkeypatch) -> None:
    """fms-hf-tuning turns an exception into sys.exit(code); the entry point still classifies the error."""
    monkeypatch.setenv("SBENCH_FAULT", "oom@step=1")
    path = write_yaml(tmp_path / "oom.yaml", {
        "campaign": "fms-oom", "experiment": "finetune_full_benchmark-v1.0.0",
        "entity": {"model_name": "tiny", "model_max_length": 64, "dataset_id": SMALL_DATASET, "batch_size": 2,
                   "number_gpus": 1, "max_steps": 3, "trainer": "fms-hf-tuning", "fms_hf_tuning_version": VERSION},
        "model_map": {"tiny": str(tiny_model)}, "data_dir": str(small_data_dir)})
    flags = ["--workdir", tmp_path / "runs", "--db", tmp_path / "r.duckdb"]
    assert cli("submit", path, "--executor", "local", "--wait", *flags).exit_code == 0
    monkeypatch.delenv("SBENCH_FAULT")
    assert cli("collect", *flags).exit_code == 0
    (run,) = sql_rows(tmp_path / "r.duckdb", "SELECT * FROM runs")
    assert run["outcome"] == "invalid" and "OutOfMemoryError" in run["reason"], run["reason"]
    err = json.loads(JobPaths(run["job_dir"]).error(0).read_text())
    assert err["kind"] == "invalid" and err["stage"] == "train"
    # fms-hf-tuning's own termination log lands in the job dir, not in the directory sbench ran from
    assert "OOM error during training" in (Path(run["job_dir"]) / "termination.0.log").read_text()
    assert not Path("error.log").exists()


def test_submit_without_preparation_refuses_a_missing_environment(cli, tmp_path, tiny_model, small_data_dir) -> None:
    inv = write_yaml(tmp_path / "inv.yaml", kit.inventory(defaults={"envs_dir": str(tmp_path / "none")}))
    path = write_yaml(tmp_path / "s.yaml", {
        "campaign": "noenv", "experiment": "finetune_lora_benchmark-v1.0.0",
        "entity": {"model_name": "tiny", "model_max_length": 64, "dataset_id": SMALL_DATASET, "batch_size": 1,
                   "number_gpus": 1, "trainer": "fms-hf-tuning", "fms_hf_tuning_version": VERSION},
        "model_map": {"tiny": str(tiny_model)}, "data_dir": str(small_data_dir)})
    res = cli("submit", path, "-i", inv, "--executor", "local", "--no-prepare", "--workdir", tmp_path / "runs",
              "--db", tmp_path / "r.duckdb")
    assert res.exit_code == 2 and "sbench env build fms-hf-tuning==3.2.2" in res.output
    assert not (tmp_path / "runs" / "noenv").exists() and not (tmp_path / "r.duckdb").exists()


def test_environment_dependent_rules_read_the_built_environment(cli, tmp_path) -> None:
    """FSDP on CPU needs FSDP v2 (accelerate 1.6+), DEEPSPEED needs deepspeed: plan reads sbench-env.json."""
    envs = tmp_path / "envs"
    _fake_env(envs, version="2.1.2", packages={"fms-hf-tuning": "2.1.2", "accelerate": "1.0.1"})
    _fake_env(envs, version=VERSION, packages={"fms-hf-tuning": VERSION, "accelerate": "1.15.0"})
    inv = _inventory(tmp_path, envs)
    doc = {"experiment": "finetune_lora_benchmark-v1.0.0", "partition": "cpu",
           "entity": {"model_name": "smollm2-135m", "model_max_length": 64, "number_gpus": 2, "batch_size": 2,
                      "trainer": "fms-hf-tuning"},
           "grid": {"fms_hf_tuning_version": ["2.1.2", VERSION], "distributed_backend": ["FSDP", "DDP", "DEEPSPEED"]}}
    got = {(p["entity"]["fms_hf_tuning_version"], p["entity"]["distributed_backend"]): p
           for p in _plan(cli, tmp_path, inv, "envrules", doc)}
    assert not got[("2.1.2", "FSDP")]["valid"]
    assert any("accelerate 1.0.1" in r for r in got[("2.1.2", "FSDP")]["reasons"])
    assert got[("2.1.2", "DDP")]["valid"] and got[(VERSION, "FSDP")]["valid"] and got[(VERSION, "DDP")]["valid"]
    for v in ("2.1.2", VERSION):
        assert any("needs deepspeed" in r for r in got[(v, "DEEPSPEED")]["reasons"])


@pytest.mark.parametrize("line", ["--index-url http://evil/simple", "git+https://x/y.git", "trl==0.11 ; id",
                                  "-e .", "trl @ file:///tmp/x"])
def test_env_build_requirements_are_packages_only(cli, tmp_path, line) -> None:
    req = tmp_path / "req.txt"
    req.write_text(f"rich\n{line}\n")
    res = cli("env", "build", f"fms-hf-tuning=={VERSION}", "--root", tmp_path / "envs", "--requirements", req)
    assert res.exit_code == 2 and f"{req}:2" in res.output
    assert not (tmp_path / "envs").exists()


@pytest.mark.train
def test_stop_after_seconds_stops_fms_hf_tuning_at_a_step_end(tmp_path, tiny_model, small_data_dir, fms_env,
                                                              cli) -> None:
    path = write_yaml(tmp_path / "stop.yaml", {
        "campaign": "fms-stop", "experiment": "finetune_full_benchmark-v1.0.0",
        "entity": {"model_name": "tiny", "model_max_length": 512, "dataset_id": SMALL_DATASET, "batch_size": 1,
                   "number_gpus": 1, "max_steps": 100000, "stop_after_seconds": 2, "gradient_accumulation_steps": 1,
                   "trainer": "fms-hf-tuning", "fms_hf_tuning_version": VERSION},
        "model_map": {"tiny": str(tiny_model)}, "data_dir": str(small_data_dir)})
    flags = ["--workdir", tmp_path / "runs", "--db", tmp_path / "r.duckdb"]
    assert cli("submit", path, "--executor", "local", "--wait", *flags).exit_code == 0
    assert cli("collect", *flags).exit_code == 0
    (m,) = sql_rows(tmp_path / "r.duckdb", "SELECT m.*, r.job_dir, r.outcome FROM measurements m JOIN runs r "
                                           "USING (run_id)")
    r0 = json.loads(JobPaths(m["job_dir"]).rank_result(0).read_text())
    assert m["outcome"] == "ok" and r0["stopped_by"] == "stop_after_seconds"
    ends = [r0["train_start_wall"], *r0["step_end_wall"]]
    # stopped at the first step that ended 2 s or more after training started, not one step later (under load
    # that may be the first step: then the start stands before it)
    assert ends[-1] - r0["train_start_wall"] >= 2 > ends[-2] - r0["train_start_wall"]
    assert r0["global_step"] == len(ends) - 1 >= 1 and m["train_runtime"] >= 2
