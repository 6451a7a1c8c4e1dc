"""Render: golden files for representative cases, and the real consumers accept them.

Goldens live in tests/golden/<case>/ (and, for the scripts that are not part of a job dir, in
tests/golden/array_wrapper/ and tests/golden/prepare_job/). Regenerate explicitly with
``pytest tests/test_render.py --update-golden``; a mismatch prints a diff.
"""

from __future__ import annotations

import difflib
import json
import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness import __version__
from harness.build.render import render_points
from harness.build.sbatch import array_sbatch
from harness.campaign.executors.slurm import group_by_shape
from harness.campaign.prepare import prepare_script
from harness.spec.inventory import load_inventory
from harness.spec.plan import plan_sweep
from harness.spec.sweep import parse_sweep

from .kit import TEST_INVENTORY

GOLDEN = Path(__file__).parent / "golden"

CASES = {
    "single_device": {
        "experiment": "finetune_full_benchmark-v1.0.0", "partition": "gpu",
        "entity": {"model_name": "llama3-8b", "model_max_length": 2048, "batch_size": 8, "number_gpus": 1,
                   "dataset_id": "news-chars-1024-entries-4096"},
    },
    "fsdp_multi_gpu": {
        "experiment": "finetune_lora_benchmark-v1.0.0", "partition": "gpu",
        "entity": {"model_name": "llama3-8b", "model_max_length": 4096, "batch_size": 16, "number_gpus": 8,
                   "accelerate_config_fsdp_transformer_layer_cls_to_wrap": "LlamaDecoderLayer",
                   "auto_stop_method": "WARMUP_60S_STABLE_120S_OR_10_STEPS"},
    },
    "ddp_multi_gpu": {
        "experiment": "finetune_full_benchmark-v1.0.0", "partition": "gpu",
        "entity": {"model_name": "granite-3.1-2b", "model_max_length": 1024, "batch_size": 16, "number_gpus": 4,
                   "distributed_backend": "DDP", "accelerate_config_mixed_precision": "bf16", "bf16": True},
    },
    "fsdp_2node_roce": {
        "experiment": "finetune_full_benchmark-v1.0.0", "partition": "gpu",
        "entity": {"model_name": "llama3-8b", "model_max_length": 8192, "batch_size": 32, "number_gpus": 16,
                   "number_nodes": 2, "enable_roce": True, "fsdp_sharding_strategy": "HYBRID_SHARD"},
    },
    "cpu_partition": {
        "experiment": "finetune_pt_benchmark-v1.0.0", "partition": "cpu",
        "entity": {"model_name": "llama3-8b", "model_max_length": 512, "batch_size": 4, "number_gpus": 2,
                   "max_steps": 10, "torch_dtype": "bfloat16"},
    },
    "cpu_2node_ddp": {
        "experiment": "finetune_lora_benchmark-v1.0.0", "partition": "cpu",
        "entity": {"model_name": "llama3-8b", "model_max_length": 512, "batch_size": 4, "number_gpus": 4,
                   "number_nodes": 2, "distributed_backend": "DDP", "enable_roce": False},
    },
}


def render_case(name: str, out: Path, inventory: Path = TEST_INVENTORY) -> Path:
    case = CASES[name]
    doc = {"campaign": f"golden-{name.replace('_', '-')}", "experiment": case["experiment"],
           "partition": case["partition"], "entity": case["entity"],
           "model_map": {"llama3-8b": "/models/llama3-8b", "granite-3.1-2b": "/models/granite-3.1-2b"},
           "data_dir": "/data/sbench"}
    sweep = parse_sweep(doc, f"{name}.yaml", out)
    inv = load_inventory(inventory)
    points = plan_sweep(sweep, inv)
    assert [p.valid for p in points] == [True], [p.reasons for p in points]
    specs = render_points(sweep, inv, points, out)
    assert len(specs) == 1
    return Path(specs[0].job_dir)


def normalise(text: str, out: Path) -> str:
    return (text.replace(str(out.resolve()), "<OUT>").replace(sys.executable, "<PYTHON>")
            .replace(f"sbench {__version__}", "sbench <VERSION>"))


def rendered_files(job_dir: Path) -> dict[str, str]:
    files = {}
    envs = [f"env/{p.name}" for p in (job_dir / "env").glob("*.sh")]
    for rel in ["job.sbatch", "launch.sh", "accelerate.yaml", *envs]:
        p = job_dir / rel
        if p.exists():
            files[rel] = p.read_text()
    return files


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name: str, tmp_path: Path, update_golden: bool) -> None:
    job_dir = render_case(name, tmp_path)
    check_golden(name, {rel: normalise(t, tmp_path) for rel, t in rendered_files(job_dir).items()}, update_golden)


def test_golden_array_wrapper(tmp_path: Path, update_golden: bool) -> None:
    """The array wrapper of points that share one resource shape, throttled to two at a time."""
    doc = {"campaign": "golden-array", "experiment": "finetune_lora_benchmark-v1.0.0", "partition": "gpu",
           "entity": {"model_name": "llama3-8b", "model_max_length": 1024, "number_gpus": 8},
           "grid": {"batch_size": [8, 16, 32]},
           "model_map": {"llama3-8b": "/models/llama3-8b"}, "data_dir": "/data/sbench"}
    sweep = parse_sweep(doc, "array.yaml", tmp_path)
    inv = load_inventory(TEST_INVENTORY)
    (group,) = group_by_shape(render_points(sweep, inv, plan_sweep(sweep, inv), tmp_path))
    assert len(group) == 3
    text = array_sbatch(sweep.campaign, group, 2, tmp_path / ".slurm")
    check_golden("array_wrapper", {"array.sbatch": normalise(text, tmp_path)}, update_golden)


def test_golden_prepare_job(tmp_path: Path, update_golden: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The preparation job of ``sbench prepare --on slurm``, run from the sweep's directory."""
    sweep_path = tmp_path / "prepare.yaml"
    sweep_path.write_text(yaml.safe_dump({
        "campaign": "golden-prepare", "experiment": "finetune_lora_benchmark-v1.0.0", "partition": "cpu",
        "entity": {"model_name": "llama3-8b", "model_max_length": 512, "batch_size": 4, "number_gpus": 2},
        "slurm": {"account": "proj", "extra": {"comment": "prepare it"}},
        "model_map": {"llama3-8b": "/models/llama3-8b"}, "data_dir": "/data/sbench"}))
    doc = yaml.safe_load(TEST_INVENTORY.read_text())
    doc["defaults"]["setup"] = ["module load cuda/12.4"]
    doc["partitions"]["cpu"]["setup"] = ["source /shared/venvs/sbench/bin/activate"]
    inv_path = tmp_path / "inv.yaml"
    inv_path.write_text(yaml.safe_dump(doc))
    monkeypatch.chdir(tmp_path)
    sweep = parse_sweep(yaml.safe_load(sweep_path.read_text()), str(sweep_path), tmp_path)
    text = prepare_script(sweep, load_inventory(inv_path), sweep_path, inv_path, None, tmp_path / ".slurm")
    check_golden("prepare_job", {"prepare.sbatch": normalise(text, tmp_path)}, update_golden)


def check_golden(name: str, files: dict[str, str], update_golden: bool) -> None:
    """*files* (relative path -> text) against tests/golden/<name>/, or written there with --update-golden."""
    gdir = GOLDEN / name
    if update_golden:
        if gdir.exists():
            for p in sorted(gdir.rglob("*"), reverse=True):
                p.unlink() if p.is_file() else p.rmdir()
        for rel, text in files.items():
            (gdir / rel).parent.mkdir(parents=True, exist_ok=True)
            (gdir / rel).write_text(text)
        return
    expected = {str(p.relative_to(gdir)): p.read_text() for p in gdir.rglob("*") if p.is_file()}
    assert sorted(files) == sorted(expected), "rendered file set differs from the golden set"
    for rel in sorted(files):
        if files[rel] != expected[rel]:
            diff = "".join(difflib.unified_diff(expected[rel].splitlines(True), files[rel].splitlines(True),
                                                f"golden/{name}/{rel}", f"rendered/{rel}"))
            pytest.fail(f"{rel} differs from its golden file (regenerate with --update-golden):\n{diff}")


@pytest.mark.parametrize("name", sorted(CASES))
def test_accelerate_config_loads_with_accelerates_own_loader(name: str, tmp_path: Path) -> None:
    from accelerate.commands.config.config_args import load_config_from_file

    job_dir = render_case(name, tmp_path)
    acc = job_dir / "accelerate.yaml"
    spec = json.loads((job_dir / "spec.json").read_text())["jobspec"]
    if spec["launcher"] == "python":
        assert not acc.exists(), "single-device runs use no accelerate config"
        return
    cfg = load_config_from_file(str(acc))
    assert cfg.num_processes == spec["num_processes"]
    assert cfg.num_machines == spec["num_machines"]
    assert cfg.main_process_port == spec["port"]
    if spec["num_machines"] > 1:
        assert cfg.main_process_ip
    backend = spec["entity"]["distributed_backend"]
    assert str(cfg.distributed_type).endswith("FSDP" if backend == "FSDP" else "MULTI_GPU")
    if backend == "FSDP" and spec["cpu_partition"]:
        assert cfg.fsdp_config["fsdp_version"] == 2
    assert cfg.use_cpu is spec["cpu_partition"]


def test_fsdp_template_fields_match_the_reference() -> None:
    """Field for field, the GPU FSDP and DDP configs carry the reference template's keys."""
    from harness.build.jobspec import accelerate_config
    from harness.spec.inventory import Host, Partition

    part = Partition("p", "p", "NVIDIA-A100-SXM4-80GB", 8, 64, 720.0, {"h": Host("h")})
    e = {"distributed_backend": "FSDP", "fsdp_sharding_strategy": "FULL_SHARD",
         "fsdp_state_dict_type": "FULL_STATE_DICT", "accelerate_config_mixed_precision": "no",
         "accelerate_config_fsdp_transformer_layer_cls_to_wrap": "LlamaDecoderLayer"}
    fsdp = accelerate_config(e, part, 1, 8, 29500, None, [])
    assert list(fsdp) == ["compute_environment", "distributed_type", "downcast_bf16", "fsdp_config",
                          "machine_rank", "main_training_function", "mixed_precision", "num_machines",
                          "rdzv_backend", "same_network", "tpu_env", "tpu_use_cluster", "tpu_use_sudo",
                          "use_cpu", "main_process_port", "num_processes"]
    assert fsdp["fsdp_config"] == {
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "fsdp_backward_prefetch": "BACKWARD_PRE",
        "fsdp_forward_prefetch": False, "fsdp_offload_params": False, "fsdp_sharding_strategy": "FULL_SHARD",
        "fsdp_state_dict_type": "FULL_STATE_DICT", "fsdp_cpu_ram_efficient_loading": True,
        "fsdp_sync_module_states": True, "fsdp_transformer_layer_cls_to_wrap": "LlamaDecoderLayer"}
    ddp = accelerate_config({**e, "distributed_backend": "DDP"}, part, 1, 4, 29500, None, [])
    assert list(ddp) == ["compute_environment", "debug", "downcast_bf16", "distributed_type", "machine_rank",
                         "main_training_function", "mixed_precision", "num_machines", "rdzv_backend",
                         "same_network", "tpu_env", "tpu_use_cluster", "tpu_use_sudo", "use_cpu",
                         "main_process_port", "num_processes"]
    assert ddp["distributed_type"] == "MULTI_GPU" and ddp["debug"] is False


def test_sbatch_directives_follow_partition_and_point(tmp_path: Path) -> None:
    job_dir = render_case("fsdp_2node_roce", tmp_path)
    lines = [x for x in (job_dir / "job.sbatch").read_text().splitlines() if x.startswith("#SBATCH")]
    d = dict(x[len("#SBATCH --"):].split("=", 1) for x in lines if "=" in x)
    assert d["nodes"] == "2" and d["ntasks-per-node"] == "1" and d["gpus-per-node"] == "8"
    # A whole node: all of its cores for the one task, all of its memory (--mem=0, never "720G", which
    # SLURM reads as 720*1024 MB), and only the inventory's hosts; multi-node RoCE owns its nodes.
    assert d["cpus-per-task"] == "96" and d["mem"] == "0" and d["nodelist"] == "node1,node2"
    assert "#SBATCH --exclusive" in lines
    assert d["time"] == "01:00:00" and d["partition"] == "gpu"
    env = _source_env(job_dir / "env" / "node1.sh")
    assert env["OMP_NUM_THREADS"] == "1"  # the inventory's own value wins over cores per rank
    single = render_case("single_device", tmp_path / "s")
    d1 = dict(x[len("#SBATCH --"):].split("=", 1) for x in (single / "job.sbatch").read_text().splitlines()
              if x.startswith("#SBATCH") and "=" in x)
    # 1 of 8 GPUs: an eighth of the cores, and an eighth of 720 GB in MB less a 5% reserve
    assert d1["cpus-per-task"] == "12" and d1["gpus-per-node"] == "1" and d1["mem"] == f"{int(720e3 / 8 * 0.95)}M"
    assert "nodelist" not in d1 and "#SBATCH --exclusive" not in (single / "job.sbatch").read_text()
    cpu = render_case("cpu_partition", tmp_path / "c")
    text = (cpu / "job.sbatch").read_text()
    assert "--gpus-per-node" not in text and "--cpus-per-task=96" in text and "--mem=0" in text


def test_roce_env_is_per_host(tmp_path: Path) -> None:
    job_dir = render_case("fsdp_2node_roce", tmp_path)
    inv = yaml.safe_load(TEST_INVENTORY.read_text())
    for host, hv in inv["partitions"]["gpu"]["hosts"].items():
        env = _source_env(job_dir / "env" / f"{host}.sh")
        hcas = "=" + ",".join(h.split(":")[0] for h in hv["roce"]["hcas"])
        assert env["NCCL_IB_HCA"] == hcas
        assert env["NCCL_IB_GID_INDEX"] == str(hv["roce"]["gid_index"])
        assert env["NCCL_SOCKET_IFNAME"] == hv["roce"]["socket_ifname"]
        assert env["NCCL_IB_DISABLE"] == "0" and env["NCCL_DEBUG"] == "INFO"
        assert env["NCCL_TOPO_FILE"] == hv["nccl_topo_file"]
        assert env["NCCL_IB_QPS_PER_CONNECTION"] == "8"  # defaults.nccl applies when RoCE is on
    off = render_case("cpu_2node_ddp", tmp_path / "off")
    for host in ("node1", "node2"):
        env = _source_env(off / "env" / f"{host}.sh")
        assert env["NCCL_IB_DISABLE"] == "1" and "NCCL_IB_HCA" not in env


def _source_env(path: Path) -> dict[str, str]:
    out = subprocess.run(["bash", "-c", f"set -a; source {shlex.quote(str(path))}; env -0"], capture_output=True,
                         check=True, env={"PATH": os.environ["PATH"]}).stdout.decode()
    return dict(item.split("=", 1) for item in out.split("\0") if "=" in item)


def test_weird_paths_are_quoted_not_injected(weird_tmp_path: Path, tmp_path: Path) -> None:
    """A model path and job dir with spaces, quotes, $ and backticks reach the process byte for byte."""
    dumper = tmp_path / "argv-dumper"
    dumper.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                      "json.dump({'argv': sys.argv, 'cwd': os.getcwd()}, open(os.environ['DUMP_TO'], 'w'))\n")
    dumper.chmod(dumper.stat().st_mode | stat.S_IEXEC)
    model = weird_tmp_path / "model $(touch /tmp/sbench-pwned) ';' \"x\""
    model.mkdir(parents=True)
    inv_path = tmp_path / "inv.yaml"
    inv_path.write_text(yaml.safe_dump({"cluster": "w", "partitions": {"p": {
        "gpu_model": "cpu", "gpus_per_node": 2, "cpus_per_node": 4, "memory_gb": 8, "python": str(dumper),
        "hosts": {"h1": {"address": "127.0.0.1", "env": {"WEIRD": "a'b\"c $d `e`"}}}}}}))
    doc = {"campaign": "weird", "experiment": "finetune_lora_benchmark-v1.0.0",
           "entity": {"model_name": "m", "model_max_length": 64, "batch_size": 2, "number_gpus": 2},
           "model_map": {"m": str(model)}, "data_dir": str(weird_tmp_path / "data $x")}
    sweep = parse_sweep(doc, "weird.yaml", weird_tmp_path)
    inv = load_inventory(inv_path)
    points = plan_sweep(sweep, inv)
    specs = render_points(sweep, inv, points, weird_tmp_path / "out")
    job = Path(specs[0].job_dir)
    for script in ("launch.sh", "job.sbatch"):
        subprocess.run(["bash", "-n", str(job / script)], check=True)
    dump = tmp_path / "dump.json"
    env = {"PATH": os.environ["PATH"], "SBENCH_HOST": "h1", "DUMP_TO": str(dump)}
    subprocess.run(["bash", str(job / "launch.sh")], check=True, env=env)
    argv = json.loads(dump.read_text())["argv"]
    assert argv[argv.index("--job-dir") + 1] == str(job)
    assert argv[argv.index("--model_name_or_path") + 1] == str(model)
    assert argv[argv.index("--training_data_path") + 1].startswith(str(weird_tmp_path / "data $x"))
    assert argv[argv.index("--response_template") + 1] == "\\n### Response:"
    assert not Path("/tmp/sbench-pwned").exists()
    assert _source_env(job / "env" / "h1.sh")["WEIRD"] == "a'b\"c $d `e`"


def test_render_cli_writes_one_dir_per_valid_point(cli, tmp_path: Path) -> None:
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({
        "campaign": "c1", "experiment": "finetune_full_benchmark-v1.0.0", "partition": "gpu",
        "entity": {"model_name": "smollm2-135m", "model_max_length": 512},
        "grid": {"batch_size": [6, 8], "number_gpus": [1, 4]}}))
    res = cli("render", sweep, "-i", TEST_INVENTORY, "-o", tmp_path / "out")
    assert res.exit_code == 0, res.output
    dirs = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert len(dirs) == 3  # batch 6 on 4 GPUs is invalid (rule 1) and reported, not rendered
    assert "rule 1: batch_size 6 is not divisible by number_gpus 4" in res.output
    for d in dirs:
        for f in ("spec.json", "job.sbatch", "launch.sh", "env/node1.sh", "env/node2.sh"):
            assert (tmp_path / "out" / d / f).exists()


@pytest.mark.slurm
@pytest.mark.parametrize("name", sorted(CASES))
def test_sbatch_test_only_accepts_every_render(name: str, tmp_path: Path, slurm_cluster) -> None:
    job_dir = render_case(name, tmp_path)
    proc = subprocess.run(["sbatch", "--test-only", str(job_dir / "job.sbatch")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "to start at" in proc.stderr


@pytest.mark.slurm
def test_sbatch_test_only_accepts_weird_job_dir(weird_tmp_path: Path, slurm_cluster) -> None:
    job_dir = render_case("cpu_2node_ddp", weird_tmp_path)
    proc = subprocess.run(["sbatch", "--test-only", str(job_dir / "job.sbatch")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
