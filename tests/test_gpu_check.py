"""The GPU check (bench/gpu_check.sh, docs/gpu-check.md): its CPU rehearsal end to end, its checks on
measurements that are right and on ones that are wrong, its sweeps, and the wheels it carries to a machine
without network."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.tags import Tag

from bench import gpu_check as gc
from bench import gpu_wheels as gw
from harness.spec.inventory import Host, Inventory, Partition, local_inventory
from harness.spec.plan import plan_sweep
from harness.spec.sweep import parse_sweep

from .kit import ROOT

# -- the rehearsal ------------------------------------------------------------------------------------------

@pytest.mark.train
@pytest.mark.slow(100)
def test_the_rehearsal_runs_every_point_and_skips_only_the_gpu_checks(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "SBENCH_GPU_WORK": str(tmp_path / "work"), "SBENCH_GPU_PYTHON": sys.executable}
    idle = os.getloadavg()[0] < (os.cpu_count() or 1)  # a machine others keep busy stretches every start-up
    proc = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), "--rehearse", str(out)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    summary = json.loads((out / "gpu_check.json").read_text())
    assert summary["ok"] is True and summary["mode"] == "rehearse"
    status = {c["name"]: c["status"] for c in summary["checks"]}
    assert {n for n, s in status.items() if s == "skipped"} == {"nvml_samples", "energy", "mfu", "memory_prediction",
                                                                 "bf16"}
    assert {n for n, s in status.items() if s == "pass"} == {"points_ran", "oom", "cpu_adjustments", "attention",
                                                              "precision_stop"}
    assert all(summary["skipped"][n] for n in ("nvml_samples", "energy", "mfu", "memory_prediction", "bf16"))
    points = {p["point"]: p for p in summary["points"]}
    assert set(points) == {p.name for p in gc.POINTS}
    for p in gc.POINTS:
        got = points[p.name]
        assert got["outcome"] == p.expect and got["batch_size"] == p.batch(gc.REHEARSAL)
        if p.expect == "ok":
            assert got["dataset_tokens_per_second"] > 0 and got["window_s"] > 0 and got["predicted_total_bytes"] > 0
    assert "OutOfMemoryError" in points["full-oom"]["reason"]
    assert points["lora-precision"]["stopped_by"] in ("precision", "max_seconds")
    assert points["full-bf16"]["stopped_by"] == "stop_after_seconds"
    # what comes back from a lent machine: the database, the job dirs' logs, the log of the whole run
    assert (out / "results.duckdb").stat().st_size > 0
    with tarfile.open(out / "jobdirs.tar.gz") as tar:
        names = tar.getnames()
    assert (out / "jobdirs.tar.gz").stat().st_size < gc.MAX_LOGS
    assert sum(n.endswith("/rank.0.json") for n in names) == len(gc.POINTS)
    assert any(n.endswith("/error.0.json") for n in names)
    log = (out / "gpu_check.log").read_text()
    assert "rehearse: all checks hold" in log and "gpu_check.sh: exit 0" in log
    if idle:
        assert summary["elapsed_s"] < 180, summary["phases_s"]


@pytest.mark.train
@pytest.mark.slow(120)
def test_the_companions_rehearsal_profiles_a_lora_point_and_runs_fsdp_on_one_rank(tmp_path: Path) -> None:
    """bench/gpu_more.sh on the CPU, as a lent GPU machine runs it: preflight, a profiled LoRA point, and full
    fine-tuning under FSDP on one rank without and with gradient checkpointing, each said with what it ran."""
    out = tmp_path / "out"
    env = {**os.environ, "SBENCH_GPU_WORK": str(tmp_path / "work"), "SBENCH_GPU_PYTHON": sys.executable,
           "SBENCH_GPU_MORE_SIZE": "tiny", "SBENCH_GPU_MORE_DEVICE": "cpu", "SBENCH_GPU_SKIP_WHEELS": "1",
           "SBENCH_GPU_MORE_SECONDS": "3", "SBENCH_GPU_MORE_SEQ": "64", "SBENCH_GPU_MORE_BATCH": "2"}
    proc = subprocess.run(["bash", str(ROOT / "bench" / "gpu_more.sh"), str(out)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)
    log = (out / "more.log").read_text() if (out / "more.log").is_file() else ""
    assert proc.returncode == 0, log[-6000:] + proc.stderr[-3000:]
    assert "gpu_more.sh: done" in log
    assert json.loads((out / "preflight.json").read_text())
    # the profiled point's phases: on one process no communication is exposed
    profile = (out / "profile.txt").read_text()
    assert "communication_exposed" in profile, profile
    fsdp = json.loads((out / "fsdp.json").read_text())
    assert [r["gradient_checkpointing"] for r in fsdp] == [False, True], fsdp
    for r in fsdp:
        assert r["outcome"] == "ok" and r["num_processes"] == 1, r
        assert r["predicted_total_bytes"] > 0 and r["tok_s"] > 0
        assert r["memory_peak_bytes"] is None and r["memory_error"] is None  # no CUDA allocator on a CPU
        # one device: one plain process, as the plan's note says
        assert r["distributed_type"] == "NO", r
        assert r["backend_note"] == "distributed_backend FSDP ignored: single-device run", r
    plain, checkpointed = fsdp
    assert checkpointed["predicted_activation_bytes"] < plain["predicted_activation_bytes"]
    assert ("fsdp one rank, gradient_checkpointing True: ok; ran NO x 1 (distributed_backend FSDP ignored: "
            "single-device run)") in log


def test_past_its_deadline_the_check_runs_no_campaign_and_says_so(tmp_path: Path) -> None:
    # The safety net of a machine lent for minutes: what did not run is named, and the summary is still written.
    out = tmp_path / "out"
    rc = gc.main(["--rehearse", "--out", str(out), "--work", str(tmp_path / "work"), "--deadline-s", "0"])
    assert rc == 1
    summary = json.loads((out / "gpu_check.json").read_text())
    assert set(summary["submit_exit_codes"]) == set(gc.campaigns())
    assert all(str(v).startswith("not run: ") for v in summary["submit_exit_codes"].values())
    ran = next(c for c in summary["checks"] if c["name"] == "points_ran")
    assert ran["status"] == "fail" and ran["detail"] == [f"{p.name}: no run in the database" for p in gc.POINTS]
    assert {"points_ran", "oom", "attention", "precision_stop"} <= set(summary["failed"])
    assert not (out / "results.duckdb").exists()


def test_a_dependency_that_does_not_import_stops_the_check_before_any_point(tmp_path: Path, monkeypatch) -> None:
    # A carried wheel that does not fit the machine's own packages shows here, in seconds, not in every point.
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "submitit.py").write_text("raise ImportError('broken on purpose')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(fake), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    out = tmp_path / "out"
    assert gc.main(["--rehearse", "--out", str(out), "--work", str(tmp_path / "work")]) == 1
    summary = json.loads((out / "gpu_check.json").read_text())
    assert summary["failed"] == ["imports"]
    assert summary["environment"]["import_errors"] == {"import submitit": "ImportError: broken on purpose"}
    assert not (tmp_path / "work" / "runs").exists()


def test_the_script_refuses_bad_arguments_with_exit_2(tmp_path: Path) -> None:
    script = str(ROOT / "bench" / "gpu_check.sh")
    for args in ([], ["--fast", str(tmp_path)], [str(tmp_path / "a"), str(tmp_path / "b")]):
        proc = subprocess.run(["bash", script, *args], capture_output=True, text=True, timeout=30)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert "gpu_check.sh:" in proc.stderr


# -- the checks, on measurements that are right and on ones that are wrong ----------------------------------

DEVICE = {"gpu_model": "NVIDIA-H100-80GB-HBM3", "cpu_partition": False, "bf16_peak_tflops": 989.4,
          "peak_source": "gpu_peaks.yaml"}


def _good_rows() -> dict[str, dict[str, Any]]:
    """What a healthy H100 run reads back: every point as it should be."""
    rows: dict[str, dict[str, Any]] = {}
    for p in gc.POINTS:
        if p.expect == "invalid":
            rows[p.name] = {"outcome": "invalid", "gpu_sample_rows": 40,
                            "reason": "GPU out of memory: torch.OutOfMemoryError: CUDA out of memory. Tried to "
                                      "allocate 4.00 GiB"}
            continue
        rows[p.name] = {
            "outcome": "ok", "dataset_tokens_per_second": 40000.0, "gpu_sample_rows": 60, "gpu_samples": 40,
            "energy_joules": 10500.0, "energy_source": "nvml", "gpu_power_watts_avg": 500.0, "window_s": 20.0,
            "mfu": 0.4, "peak_tflops": 989.4, "model_tflops_per_gpu": 395.0,
            "memory_peak_bytes": 20_000_000_000, "predicted_total_bytes": 19_000_000_000,
            "effective_torch_dtype": "bfloat16", "attn_implementation": "sdpa",
            "adjustments": [{"setting": "attn_implementation", "asked": "flash_attention_2", "used": "sdpa",
                             "why": "the flash_attn package is not installed in the trainer's python"}],
            "rank0": {"ran": {"torch_dtype": "bfloat16", "bf16": True, "attn_implementation": "sdpa"},
                      "window": "steady_state" if p.precision else "whole_run",
                      "auto_stop": {"rule": "precision"} if p.precision else None},
            "stopped_by": "precision" if p.precision else "stop_after_seconds", "global_step": 120,
            "window_steps": 90 if p.precision else 120, "ci_rel_halfwidth": 0.012 if p.precision else None}
    return rows


def _status(rows: dict[str, dict[str, Any]]) -> dict[str, gc.Check]:
    return {c.name: c for c in gc.run_checks(rows, DEVICE, gc.GPU)}


def test_every_check_holds_on_a_healthy_gpu_run() -> None:
    checks = _status(_good_rows())
    assert {n: c.status for n, c in checks.items()} == {
        "points_ran": "pass", "nvml_samples": "pass", "energy": "pass", "mfu": "pass", "memory_prediction": "pass",
        "oom": "pass", "bf16": "pass", "cpu_adjustments": "skipped", "attention": "pass", "precision_stop": "pass"}
    assert any("+5.0 %" in line for line in checks["energy"].detail)  # 10500 J against 500 W x 20 s
    assert any("-5.0 %" in line for line in checks["memory_prediction"].detail)


def _set(point: str, **values: Any):
    def change(rows: dict[str, dict[str, Any]]) -> None:
        rows[point].update(values)
    return change


def _ran(point: str, **values: Any):
    def change(rows: dict[str, dict[str, Any]]) -> None:
        rows[point]["rank0"]["ran"].update(values)
    return change


@pytest.mark.parametrize("change, failing, named", [
    (_set("lora-small", gpu_sample_rows=0, gpu_samples=0), "nvml_samples", "lora-small"),
    (_set("full-oom", gpu_sample_rows=0), "nvml_samples", "full-oom"),
    (_set("full-bf16", gpu_samples=0), "nvml_samples", "full-bf16"),
    (_set("prompt-tuning", energy_joules=12000.0), "energy", "prompt-tuning"),  # 20 % over power x window
    (_set("lora-large", energy_joules=None, energy_source=None), "energy", "lora-large"),
    (_set("full-bf16", mfu=0.9), "mfu", "full-bf16"),
    (_set("prompt-tuning", mfu=0.02), "mfu", "prompt-tuning"),
    (_set("lora-small", peak_tflops=312.0), "mfu", "lora-small"),  # the run used another device's peak
    (_set("lora-large", predicted_total_bytes=26_000_000_000), "memory_prediction", "lora-large"),  # +30 %
    (_set("full-bf16", memory_peak_bytes=None), "memory_prediction", "full-bf16"),
    (_set("full-oom", outcome="failed", reason="rank 0: RuntimeError: NCCL error"), "oom", "full-oom"),
    (_set("full-oom", outcome="ok", reason=None), "oom", "full-oom"),
    (_set("lora-precision", effective_torch_dtype="float32"), "bf16", "lora-precision"),
    (_ran("full-bf16", bf16=False), "bf16", "full-bf16"),
    (_set("prompt-tuning", attn_implementation="eager"), "attention", "prompt-tuning"),
    (_ran("lora-large", attn_implementation="flash_attention_2"), "attention", "lora-large"),
    (_set("lora-precision", stopped_by="max_seconds"), "precision_stop", "lora-precision"),
    (_set("lora-precision", ci_rel_halfwidth=0.05), "precision_stop", "lora-precision"),
    (_set("lora-small", outcome="failed", reason="rank 0: RuntimeError: boom"), "points_ran", "lora-small"),
])
def test_a_wrong_measurement_fails_its_check_and_names_the_point(change, failing: str, named: str) -> None:
    rows = copy.deepcopy(_good_rows())
    change(rows)
    checks = _status(rows)
    assert checks[failing].status == "fail"
    assert any(line.startswith(named) for line in checks[failing].detail), checks[failing].detail


def test_a_missing_point_and_an_unknown_peak_fail() -> None:
    rows = _good_rows()
    del rows["lora-large"]
    assert _status(rows)["points_ran"].status == "fail"
    checks = gc.run_checks(_good_rows(), {**DEVICE, "bf16_peak_tflops": None, "peak_source": "unknown"}, gc.GPU)
    mfu = next(c for c in checks if c.name == "mfu")
    assert mfu.status == "fail" and "NVIDIA-H100-80GB-HBM3" in mfu.detail[0]


def test_the_summary_table_and_point_figures() -> None:
    rows = _good_rows()
    points = [gc.point_summary(p, rows.get(p.name), gc.GPU) for p in gc.POINTS]
    full = points[0]
    assert full["memory_error"] == pytest.approx(19 / 20 - 1)
    assert full["energy_vs_power_window"] == pytest.approx(10500 / 10000 - 1)
    text = gc.table(points)
    assert text.splitlines()[0].split()[:3] == ["point", "outcome", "batch"]
    assert "40,000" in text and "-5.0 %" in text and len(text.splitlines()) == len(gc.POINTS) + 1


# -- the sweeps ---------------------------------------------------------------------------------------------

def _h100_inventory() -> Inventory:
    part = Partition(name="local", slurm_partition="local", gpu_model="NVIDIA-H100-80GB-HBM3", gpus_per_node=1,
                     cpus_per_node=16, memory_gb=128.0, hosts={"gpu1": Host(name="gpu1", address="127.0.0.1")})
    return Inventory(cluster="local", source="<test>", partitions={"local": part})


def test_the_gpu_sweeps_fit_an_h100_but_the_oom_point_is_far_past_it(tmp_path: Path) -> None:
    from transformers import LlamaConfig

    from harness.data.tinymodel import SIZES

    shape = SIZES["1b"]
    model = tmp_path / "model"
    LlamaConfig(vocab_size=shape["vocab_size"], hidden_size=shape["hidden_size"],
                num_hidden_layers=shape["num_layers"], num_attention_heads=shape["num_heads"],
                num_key_value_heads=shape["num_kv_heads"], intermediate_size=shape["intermediate_size"],
                tie_word_embeddings=False).save_pretrained(model)
    inv = _h100_inventory()
    seen = set()
    for name in gc.campaigns():
        sweep = parse_sweep(gc.sweep_doc(name, gc.GPU, model, tmp_path / "data"), f"<{name}>", tmp_path)
        for point in plan_sweep(sweep, inv, memory=True):
            assert point.valid, point.reasons
            mine = next(p for p in gc.POINTS if p.campaign == name and p.batch(gc.GPU) == point.entity["batch_size"])
            seen.add(mine.name)
            mem = point.memory or {}
            assert mem["status"] == "ok"
            if mine.expect == "invalid":
                assert mem["predicted_oom"] is True and mem["total_bytes"] > 4 * mem["device_bytes"]
            else:
                assert mem["predicted_oom"] is False, (mine.name, mem["total_bytes"])
            assert point.entity["stop_after_seconds"] == (-1.0 if mine.precision else gc.GPU.train_s)
            assert sweep.runner.stop_method == ("precision" if mine.precision else "fixed")
    assert seen == {p.name for p in gc.POINTS}


@pytest.mark.parametrize("prof", [gc.GPU, gc.REHEARSAL], ids=lambda p: p.name)
def test_every_entry_fills_model_max_length_and_keeps_its_response(tmp_path: Path, prof: gc.Profile) -> None:
    # Full-width batches are what the memory prediction assumes; a response cut off would mask the entry's loss.
    from harness.data.datagen import generate_dataset
    from harness.data.tinymodel import SIZES, train_tokenizer

    shape = SIZES[prof.model_size]
    tok = train_tokenizer(vocab_size=shape["vocab_size"])
    path = tmp_path / f"{prof.dataset_id}.jsonl"
    generate_dataset(prof.dataset_id, path, entries=min(prof.entries, 64))
    for line in path.read_text().splitlines():
        text = json.loads(line)["output"]
        assert len(tok(text)["input_ids"]) > prof.seq
        assert len(tok(text[:text.index("### Response:")])["input_ids"]) < prof.seq - 64  # 64+ response tokens


def test_the_rehearsal_sweeps_plan_on_this_machine(tmp_path: Path, tiny_model: Path) -> None:
    inv = local_inventory()
    for name in gc.campaigns():
        sweep = parse_sweep(gc.sweep_doc(name, gc.REHEARSAL, tiny_model, tmp_path / "data"), name, tmp_path)
        points = plan_sweep(sweep, inv)
        assert points and all(p.valid for p in points)


# -- the wheels ---------------------------------------------------------------------------------------------

def make_wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = (), tag: str = "py3-none-any",
               module: str | None = None) -> Path:
    """A real (minimal) wheel: one module, METADATA with its requirements, WHEEL and RECORD."""
    dist = f"{name.replace('-', '_')}-{version}"
    path = folder / f"{dist}-{tag}.whl"
    folder.mkdir(parents=True, exist_ok=True)
    meta = "Metadata-Version: 2.1\n" + f"Name: {name}\nVersion: {version}\n" + \
        "".join(f"Requires-Dist: {r}\n" for r in requires)
    mod = module or name.replace("-", "_")
    files = {f"{mod}/__init__.py": f"VERSION = {version!r}\n", f"{dist}.dist-info/METADATA": meta,
             f"{dist}.dist-info/WHEEL": f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: {tag}\n"}
    record = "".join(f"{n},,\n" for n in files) + f"{dist}.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for n, text in {**files, f"{dist}.dist-info/RECORD": record}.items():
            z.writestr(n, text)
    return path


def test_the_plan_takes_the_fallback_a_machine_with_an_old_hub_needs(tmp_path: Path) -> None:
    make_wheel(tmp_path, "dset", "2.0", ("hubby>=1.31", "tabular"))
    make_wheel(tmp_path, "dset", "1.0", ("hubby<2.0", "tabular", "fetcher"))
    make_wheel(tmp_path, "tabular", "3.0")
    make_wheel(tmp_path, "fetcher", "1.0")
    wheels, tags = gw.read_wheels(tmp_path), {Tag("py3", "none", "any")}
    roots = [Requirement("dset>=1.0")]
    old = gw.plan_install(roots, {"hubby": "1.10"}.get, wheels, tags, gw.target_environment())
    assert {n: str(w.version) for n, w in old.chosen.items()} == {"dset": "1.0", "tabular": "3.0", "fetcher": "1.0"}
    assert old.kept == {"hubby": "1.10"} and not old.missing
    new = gw.plan_install(roots, {"hubby": "1.40", "tabular": "3.1"}.get, wheels, tags, gw.target_environment())
    assert {n: str(w.version) for n, w in new.chosen.items()} == {"dset": "2.0"}
    assert new.kept == {"hubby": "1.40", "tabular": "3.1"}
    # the machine's own satisfying version wins over a carried one; a requirement nobody has is named with its asker
    make_wheel(tmp_path, "needy", "1.0", ("nowhere>=2",))
    plan = gw.plan_install([Requirement("needy"), Requirement("tabular>=2")], {"tabular": "2.5"}.get,
                           gw.read_wheels(tmp_path), tags, gw.target_environment())
    assert "tabular" not in plan.chosen and plan.kept["tabular"] == "2.5"
    assert plan.missing == ["nowhere>=2 (asked by needy 1.0)"]


def test_check_folder_names_a_wheel_for_another_platform_and_an_unmet_requirement(tmp_path: Path) -> None:
    assert gw.check_folder(tmp_path / "none") == [f"{tmp_path / 'none'}: no wheels (run make gpu-wheels)"]
    make_wheel(tmp_path, "fine", "1.0", ("numpy",))  # numpy: one of the machine's packages' dependencies
    make_wheel(tmp_path, "winonly", "1.0", tag="cp312-cp312-win_amd64")
    make_wheel(tmp_path, "orphan", "1.0", ("no-such-dependency>=1",))
    problems = gw.check_folder(tmp_path)
    assert any(p.startswith("winonly-1.0-cp312-cp312-win_amd64.whl: not a wheel for CPython 3.12") for p in problems)
    assert any("orphan-1.0-py3-none-any.whl requires no-such-dependency>=1" in p for p in problems)
    assert not any(p.startswith("fine-") for p in problems)
    assert any(p.startswith("sbench requires duckdb") for p in problems)  # the folder lacks what the machine lacks


@pytest.mark.parametrize("use_pip", [True, False])
def test_install_puts_only_what_is_missing_first_on_the_path(tmp_path: Path, use_pip: bool, capsys) -> None:
    folder, target = tmp_path / "wheels", tmp_path / "site"
    make_wheel(folder, "gpu-check-probe", "1.2", ("gpu-check-dep",))
    make_wheel(folder, "gpu-check-dep", "0.3")
    make_wheel(folder, "pyyaml", "0.1", module="yaml_decoy")  # this python's own pyyaml satisfies: not taken
    roots = [Requirement("gpu-check-probe"), Requirement("pyyaml>=6")]
    assert gw.install(folder, target, roots=roots, use_pip=use_pip) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["install"] == {"gpu-check-dep": "0.3", "gpu-check-probe": "1.2"} and "pyyaml" in report["kept"]
    code = "import gpu_check_probe, gpu_check_dep; print(gpu_check_probe.VERSION)"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(target)},
                         capture_output=True, text=True)
    assert out.stdout.strip() == "1.2", out.stderr
    assert not (target / "yaml_decoy").exists()
    assert gw.install(folder, tmp_path / "dry", roots=[Requirement("gpu-check-probe"), Requirement("absent-pkg")],
                      dry_run=True) == 1
    assert not (tmp_path / "dry").exists()


def test_the_download_list_leaves_out_what_the_machine_has() -> None:
    pins = gw.download_list(gw.target_environment())
    names = {p.split("==")[0] for p in pins}
    assert {"duckdb", "trl", "submitit", "datasets", "orjson", "pandas", "cloudpickle"} <= names
    assert not names & {"torch", "transformers", "numpy", "pyarrow", "pillow", "nvidia-ml-py", "huggingface-hub"}
    assert all("==" in p for p in pins)
