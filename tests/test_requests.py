"""Requests SLURM accepts: whole nodes by --mem=0, shares in MB with a reserve, the task owns its cores,
OMP_NUM_THREADS per rank, only inventory hosts, validated extra sbatch options; checked by the real
controller of the test cluster with ``sbatch --test-only``."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path

import pytest
import yaml

from harness.build.render import render_points
from harness.cluster.fit import ClusterFit, cluster_fit, within_slurms_time
from harness.slurm.client import Slurm
from harness.slurm.limits import JobLimit
from harness.slurm.sinfo import misfits, parse_sinfo
from harness.spec.inventory import load_inventory
from harness.spec.plan import plan_sweep
from harness.spec.sweep import parse_sweep

from .kit import TEST_INVENTORY

SINFO = "node1|96|1000000|gpu:8\nnode2|96|1000000|gpu:h100:8(S:0-1)\ncpu[01-02]|64|512000|(null)\n"


def directives(job_dir: Path) -> dict[str, str]:
    out = {}
    for line in (job_dir / "job.sbatch").read_text().splitlines():
        if line.startswith("#SBATCH --"):
            k, _, v = line[len("#SBATCH --"):].partition("=")
            out[k] = v or "true"
    return out


def inventory(tmp_path: Path, **over) -> Path:
    doc = yaml.safe_load(TEST_INVENTORY.read_text())
    for part in doc["partitions"].values():
        part.update(copy.deepcopy(over))
    p = tmp_path / "inv.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def render(tmp_path: Path, inv_path: Path, entity: dict, grid: dict, partition: str = "gpu", slurm=None,
           fit: ClusterFit | None = None) -> list[Path]:
    doc = {"campaign": "req", "experiment": "finetune_full_benchmark-v1.0.0", "partition": partition,
           "entity": {"model_name": "llama3-8b", "model_max_length": 1024, **entity}, "grid": grid,
           "model_map": {"llama3-8b": "/models/llama3-8b"}, "data_dir": "/data/sbench"}
    if slurm:
        doc["slurm"] = slurm
    sweep = parse_sweep(doc, "req.yaml", tmp_path)
    inv = load_inventory(inv_path)
    points = [p for p in plan_sweep(sweep, inv) if p.valid]
    specs = render_points(sweep, inv, points, tmp_path / "out", exclude=fit.exclude if fit else None)
    return [Path(s.job_dir) for s in specs]


def test_threads_per_rank_when_the_inventory_sets_none(tmp_path: Path) -> None:
    doc = yaml.safe_load(TEST_INVENTORY.read_text())
    del doc["defaults"]["env"]["OMP_NUM_THREADS"]
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump(doc))
    for gpus, threads in ((8, "12"), (2, "12"), (1, "12")):
        (jd,) = render(tmp_path / str(gpus), inv, {"batch_size": 8}, {"number_gpus": [gpus]})
        env = (jd / "env" / "node1.sh").read_text()
        assert f"export OMP_NUM_THREADS='{threads}'" in env  # 96 cores / 8 GPUs: 12 per rank, never 16 x 8


def test_extra_sbatch_options_from_sweep_and_partition_are_rendered_quoted(tmp_path: Path) -> None:
    inv = inventory(tmp_path, slurm_extra={"reservation": "bench night", "gres": "gpu:h100:8"})
    (jd,) = render(tmp_path, inv, {"batch_size": 8, "number_gpus": 8}, {},
                   slurm={"extra": {"switches": "1@10:00", "container-image": "nvcr.io#nvidia/pytorch:24.05-py3",
                                    "container_mounts": "/shared:/shared", "gres": "gpu:a100:8",
                                    "no-container-mount-home": True}})
    d = directives(jd)
    assert d["reservation"] == '"bench night"' and d["switches"] == "1@10:00"
    assert d["gres"] == "gpu:a100:8"  # the sweep's value wins over the partition's
    assert d["container-image"] == "nvcr.io#nvidia/pytorch:24.05-py3" and d["container-mounts"] == "/shared:/shared"
    assert d["no-container-mount-home"] == "true"
    proc = subprocess.run(["bash", "-n", str(jd / "job.sbatch")])
    assert proc.returncode == 0


@pytest.mark.parametrize("extra,words", [
    ({"wrap": "id"}, ["slurm.extra.wrap", "is not an sbatch option"]),
    ({"mem": "10G"}, ["slurm.extra.mem", "sets nodes"]),
    ({"export": "ALL"}, ["slurm.extra.export"]),
    ({"reservaton": "x"}, ["did you mean 'reservation'"]),
    ({"comment": "a\nb"}, ["slurm.extra.comment", "one-line"]),
    ({"comment": [1]}, ["slurm.extra.comment", "must be a string"]),
])
def test_extra_options_are_validated(cli, tmp_path: Path, extra: dict, words: list[str]) -> None:
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({"campaign": "x", "experiment": "finetune_full_benchmark-v1.0.0",
                                     "partition": "gpu", "slurm": {"extra": extra},
                                     "entity": {"model_name": "smollm2-135m", "model_max_length": 64,
                                                "batch_size": 8, "number_gpus": 8}}))
    res = cli("plan", sweep, "-i", TEST_INVENTORY)
    assert res.exit_code == 2
    assert all(w in res.output for w in words), res.output


def test_sinfo_is_read_and_misfits_are_named() -> None:
    nodes = parse_sinfo(SINFO)
    assert nodes["node2"].gpus == 8 and nodes["cpu01"].gpus == 0 and nodes["cpu02"].memory_mb == 512000
    res = {"cpus_per_task": 128, "mem": "1000G", "gpus_per_node": 8}
    found = misfits(["node1", "gpu-x"], nodes, res, "gpu")
    assert any("gpu-x are not nodes" in m for m in found)
    assert any("--cpus-per-task=128" in m for m in found)
    assert any("--mem=1000G" in m and "1000000 MB" in m for m in found)
    assert misfits(["node1"], nodes, {"cpus_per_task": 96, "mem": "0", "gpus_per_node": 8}, "gpu") == []


def test_a_time_over_the_partitions_limit_is_refused_before_anything_is_asked_of_slurm(cli, tmp_path: Path) -> None:
    # the inventory's time_limit (SLURM's MaxTime as discover writes it): a longer slurm.time is an input error
    inv = inventory(tmp_path, time_limit="00:30:00")
    sweep = tmp_path / "long.yaml"
    sweep.write_text(yaml.safe_dump({"campaign": "long", "experiment": "finetune_full_benchmark-v1.0.0",
                                     "partition": "cpu", "entity": {"model_name": "smollm2-135m",
                                                                    "model_max_length": 64, "batch_size": 2,
                                                                    "number_gpus": 1},
                                     "slurm": {"time": "1-00:00:00"}}))
    for command in ("plan", "render", "submit"):
        extra = ["-o", str(tmp_path / "out")] if command == "render" else \
            ["--executor", "slurm", "--workdir", str(tmp_path / "runs")] if command == "submit" else []
        res = cli(command, sweep, "-i", inv, *extra)
        assert res.exit_code == 2, (command, res.output)
        assert "slurm.time: 1-00:00:00 is longer than partition 'cpu' allows: time_limit 00:30:00" in res.output
        assert "partitions.cpu.time_limit" in res.output and "PartitionTimeLimit" in res.output
        assert "Traceback" not in res.output
    assert not (tmp_path / "runs").exists()
    sweep.write_text(sweep.read_text().replace("1-00:00:00", "'00:30:00'"))
    assert cli("plan", sweep, "-i", inv).exit_code == 0  # at the limit is within it


def test_slurms_own_time_limit_is_read_with_the_nodes_and_bounds_requests_and_packs(tmp_path: Path) -> None:
    # sinfo's %l: the partition's MaxTime, which the inventory may not record (or record wrong)
    nodes = parse_sinfo("node1|96|1000000|(null)|30:00\nnode2|96|1000000|(null)|30:00\n")
    assert nodes["node1"].time_limit == "30:00" and parse_sinfo(SINFO)["node1"].time_limit is None
    fit = ClusterFit(nodes=nodes)
    assert fit.time_limit == "30:00"  # 30 minutes: sinfo writes MM:SS below an hour
    inv = load_inventory(TEST_INVENTORY)  # its cpu partition says 00:20:00, SLURM says 30:00: packs keep the tighter
    assert fit.within(inv.partition("cpu").time_limit) == "00:20:00" and fit.within(None) == "30:00"
    assert fit.within("2:00:00") == "30:00" and ClusterFit(nodes=parse_sinfo(SINFO)).within("01:00:00") == "01:00:00"
    sweep = parse_sweep({"campaign": "x", "experiment": "finetune_full_benchmark-v1.0.0", "partition": "cpu",
                         "entity": {"model_name": "smollm2-135m", "model_max_length": 64, "number_gpus": 1},
                         "grid": {"batch_size": [1, 2, 4]}, "slurm": {"time": "00:20:00"}}, "x.yaml", tmp_path)
    specs = render_points(sweep, inv, [p for p in plan_sweep(sweep, inv) if p.valid], tmp_path / "out")
    assert fit.over_time(specs) is None
    for s in specs:
        s.resources["time"] = "00:45:00"
    over = fit.over_time(specs) or ""
    assert "--time=00:45:00 (3 point(s)) but SLURM's partition for 'cpu' allows at most 30:00 (MaxTime" in over
    assert "PartitionTimeLimit" in over and 'partitions.cpu.time_limit: "30:00"' in over
    assert over in fit.check(specs, inv)  # render shows it as a warning; submit refuses it (exit 2)
    assert ClusterFit(nodes=parse_sinfo(SINFO)).over_time(specs) is None  # no limit said: nothing to check
    # sinfo's %s (MinNodes-MaxNodes): a point on more nodes than one job may have pends for ever
    capped = ClusterFit(nodes=parse_sinfo("node[1-2]|96|1000000|(null)|infinite|1-1\n"))
    assert capped.nodes is not None and capped.nodes["node1"].max_nodes == 1 and nodes["node1"].max_nodes is None
    two = parse_sweep({"campaign": "z", "experiment": "finetune_full_benchmark-v1.0.0", "partition": "cpu",
                       "entity": {"model_name": "smollm2-135m", "model_max_length": 64, "batch_size": 2},
                       "grid": {"number_gpus": [1, 2], "number_nodes": [1, 2]}}, "z.yaml", tmp_path)
    wide = render_points(two, inv, [p for p in plan_sweep(two, inv) if p.valid], tmp_path / "o3")
    said = capped.refusals(wide)
    assert len(said) == 1 and said[0].startswith("--nodes=2 (1 point(s)) but SLURM's partition for 'cpu' lets one "
                                                 "job have at most 1 node(s) (MaxNodes"), said
    assert capped.refusals([s for s in wide if s.resources["nodes"] == 1]) == [] and fit.refusals(wide) == []
    # an inventory with no time_limit and a sweep with no slurm.time: the points ask for SLURM's MaxTime (30 min)
    # rather than the default hour, which the partition would refuse
    doc = yaml.safe_load(TEST_INVENTORY.read_text())
    del doc["partitions"]["cpu"]["time_limit"]
    (tmp_path / "bare.yaml").write_text(yaml.safe_dump(doc))
    bare = load_inventory(tmp_path / "bare.yaml")
    untimed = parse_sweep({"campaign": "y", "experiment": "finetune_full_benchmark-v1.0.0", "partition": "cpu",
                           "entity": {"model_name": "smollm2-135m", "model_max_length": 64, "number_gpus": 1,
                                      "batch_size": 2}}, "y.yaml", tmp_path)
    fit = ClusterFit(nodes=nodes)
    bounded = within_slurms_time(bare, untimed, fit)
    assert bounded.partition("cpu").time_limit == "30:00" and bare.partition("cpu").time_limit is None
    assert "SLURM's limit, 30:00 (MaxTime, sinfo), not the default 01:00:00" in fit.notes[0]
    (spec,) = render_points(untimed, bounded, [p for p in plan_sweep(untimed, bounded) if p.valid], tmp_path / "o2")
    assert spec.resources["time"] == "30:00" and fit.over_time([spec]) is None
    # a limit above the default hour, or a time the user named, is left as it was
    assert within_slurms_time(bare, untimed, ClusterFit(nodes=parse_sinfo(SINFO.replace("(null)\n",
                                                                                        "(null)|2:00:00\n")))) is bare
    assert within_slurms_time(inv, sweep, ClusterFit(nodes=nodes)) is inv


def test_an_associations_or_qos_per_job_limits_bound_requests_like_the_partitions(tmp_path: Path) -> None:
    # what scontrol show assoc_mgr gives of the user's association and QOS (harness.slurm.limits.parse_job_limits)
    limits = [JobLimit("wall", 15, "QOS debug", "MaxWallPJ=15", "QOSMaxWallDurationPerJobLimit"),
              JobLimit("node", 1, "association root/alice", "MaxTRESPJ node=1", "AssocMaxNodesPerJobLimit"),
              JobLimit("gres/gpu", 8, "account physics", "MaxTRESPJ gres/gpu=8", "AssocMaxGRESPerJob")]
    nodes = parse_sinfo("node1|96|737280|gpu:8|2:00:00\nnode2|96|737280|gpu:8|2:00:00\n")
    fit = ClusterFit(nodes=nodes, job_limits=limits)
    assert fit.time_limit == "00:15:00" and fit.within("01:00:00") == "00:15:00"  # packs stay within it too
    inv = load_inventory(TEST_INVENTORY)
    sweep = parse_sweep({"campaign": "q", "experiment": "finetune_full_benchmark-v1.0.0", "partition": "gpu",
                         "entity": {"model_name": "smollm2-135m", "model_max_length": 64, "batch_size": 16},
                         "grid": {"number_gpus": [8, 16], "number_nodes": [1, 2]},
                         "slurm": {"time": "00:20:00"}}, "q.yaml", tmp_path)
    specs = render_points(sweep, inv, [p for p in plan_sweep(sweep, inv) if p.valid], tmp_path / "out")
    assert sorted((s.resources["nodes"], s.resources["gpus_per_node"]) for s in specs) == [(1, 8), (2, 4), (2, 8)]
    said = fit.refusals(specs)
    assert said[0].startswith("--time=00:20:00 (3 point(s)) but the QOS debug lets one job have at most 00:15:00 "
                              "(QOS debug MaxWallPJ=15, scontrol show assoc_mgr)"), said
    assert "QOSMaxWallDurationPerJobLimit" in said[0] and "slurm.time" in said[0]
    assert said[1].startswith("2 node(s) (2 point(s)) asked, but the association root/alice lets one job have at "
                              "most 1 node(s) (MaxTRESPJ node=1"), said
    assert said[2].startswith("16 GPU(s) (1 point(s)) asked, but the account physics lets one job have at most 8 "
                              "GPU(s)") and "AssocMaxGRESPerJob" in said[2] and len(said) == 3, said
    one = [s for s in specs if s.resources["nodes"] == 1]
    for s in one:
        s.resources["time"] = "00:15:00"
    assert fit.refusals(one) == []  # at the limits is within them
    # CPUs: a whole-node point holds its nodes' every CPU
    cpus = ClusterFit(nodes=nodes, job_limits=[JobLimit("cpu", 64, "association root/alice", "MaxTRESPJ cpu=64",
                                                        "AssocMaxCpuPerJobLimit")])
    assert one[0].resources.get("exclusive") and cpus.over_job_limits(one)[0].startswith("96 CPU(s) (1 point(s))")
    assert "(slurm.account, slurm.qos)" in cpus.over_job_limits(one)[0]
    # the partition's own QOS binds every job in it: another account or QOS does not lift it, another partition does
    part = ClusterFit(nodes=nodes, job_limits=[JobLimit("cpu", 64, "partition batch's QOS part", "MaxTRESPJ cpu=64",
                                                        "QOSMaxCpuPerJobLimit", partition=True)])
    (said,) = part.over_job_limits(one)
    assert "but the partition batch's QOS part lets one job have at most 64 CPU(s)" in said
    assert "use another partition" in said and "slurm.qos" not in said
    # no limit read (no accounting, another user's association): the partition's alone
    assert ClusterFit(nodes=nodes).time_limit == "2:00:00" and ClusterFit(nodes=nodes).refusals(specs) == []


def test_other_nodes_of_the_slurm_partition_are_excluded(tmp_path: Path) -> None:
    doc = yaml.safe_load(TEST_INVENTORY.read_text())
    doc["partitions"]["gpu"]["hosts"]["node3"] = {"address": "198.18.0.13"}
    inv_path = tmp_path / "inv.yaml"
    inv_path.write_text(yaml.safe_dump(doc))
    inv = load_inventory(inv_path)

    asked = []

    def sinfo(argv):
        asked.append(argv)
        return subprocess.CompletedProcess(argv, 0, "node[1-4]|96|1000000|gpu:8\n", "")

    sweep = parse_sweep({"campaign": "x", "experiment": "finetune_full_benchmark-v1.0.0", "partition": "gpu",
                         "entity": {"model_name": "smollm2-135m", "model_max_length": 64, "batch_size": 48},
                         "grid": {"number_gpus": [8, 24], "number_nodes": [1, 3]}}, "x.yaml", tmp_path)
    points = [p for p in plan_sweep(sweep, inv) if p.valid]
    fit = cluster_fit(inv, sweep, points, Slurm(sinfo))
    assert fit.exclude == ["node4"]
    # the point's SLURM partition, then the per-job limits of the user's association (none in this answer)
    assert [a[:2] for a in asked] == [["sinfo", "-h"], ["scontrol", "show"]] and "gpu" in asked[0]
    dirs = [Path(s.job_dir) for s in render_points(sweep, inv, points, tmp_path / "out", exclude=fit.exclude)]
    by_nodes = {directives(d)["nodes"]: directives(d) for d in dirs}
    assert by_nodes["1"]["exclude"] == "node4" and "nodelist" not in by_nodes["1"]
    assert by_nodes["3"]["nodelist"] == "node1,node2,node3" and "exclude" not in by_nodes["3"]


@pytest.mark.slurm
def test_every_two_node_gpu_point_is_accepted_by_the_controller(slurm_cluster, tmp_path: Path) -> None:
    """memory_gb: 1000 on nodes with RealMemory=1000000: '1000G' would be refused; what sbench renders is not."""
    inv = inventory(tmp_path, memory_gb=1000)
    dirs = render(tmp_path, inv, {"batch_size": 16, "number_nodes": 2},
                  {"number_gpus": [2, 4, 8, 16], "enable_roce": [False, True]})
    assert len(dirs) == 8
    seen_mem = set()
    for jd in dirs:
        d = directives(jd)
        seen_mem.add(d["mem"])
        proc = subprocess.run(["sbatch", "--test-only", str(jd / "job.sbatch")], capture_output=True, text=True)
        assert proc.returncode == 0 and "to start at" in proc.stderr, (d, proc.stderr)
    assert "0" in seen_mem and any(m.endswith("M") for m in seen_mem)  # whole nodes and shares both covered
    old_style = subprocess.run(["sbatch", "--test-only", "-N2", "-p", "gpu", "--mem=1000G", "--wrap", "true"],
                               capture_output=True, text=True)
    assert old_style.returncode != 0  # the controller really refuses the spec-sheet figure


@pytest.mark.slurm
def test_render_asks_the_controller_and_keeps_jobs_on_inventory_hosts(cli, slurm_cluster, tmp_path: Path) -> None:
    doc = yaml.safe_load(TEST_INVENTORY.read_text())
    del doc["partitions"]["cpu"]["hosts"]["node2"]  # node2 is in the SLURM partition, not in the inventory
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump(doc))
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({"campaign": "x", "experiment": "finetune_full_benchmark-v1.0.0",
                                     "partition": "cpu",
                                     "entity": {"model_name": "smollm2-135m", "model_max_length": 64,
                                                "batch_size": 2, "number_gpus": 2}}))
    res = cli("render", sweep, "-i", inv, "-o", tmp_path / "out")
    assert res.exit_code == 0, res.output
    (jd,) = [p.parent for p in (tmp_path / "out").glob("*/job.sbatch")]
    d = directives(jd)
    assert d["nodelist"] == "node1"  # the point needs every inventory host
    proc = subprocess.run(["sbatch", "--test-only", str(jd / "job.sbatch")], capture_output=True, text=True)
    assert proc.returncode == 0 and "node1" in proc.stderr and "node2" not in proc.stderr, proc.stderr


def spec_share(job_dir: Path) -> dict:
    return json.loads((job_dir / "spec.json").read_text())["jobspec"]["node_share"]


def test_whole_node_points_are_exclusive_and_partial_ones_state_their_share(tmp_path: Path) -> None:
    """Isolation by default on every partition: a point that uses whole nodes owns them (--exclusive, --mem=0);
    a partial-node point shares its node and spec.json says which part; the sweep's slurm.exclusive decides
    for every point."""
    inv = inventory(tmp_path)  # cpu: 2 workers, 96 cores, 16 GB per node; gpu: 8 GPUs, 96 cores, 720 GB
    cases = {  # (partition, slurm) -> {number_gpus: (exclusive, --mem, share text)}
        ("cpu", None): {2: (True, "0", "whole node, exclusive"),
                        1: (False, "7600M", "1/2 node (1 of 2 workers, 48 of 96 cores, 7600M), shared")},
        ("gpu", None): {8: (True, "0", "whole node, exclusive"),
                        2: (False, f"{int(720e3 / 4 * 0.95)}M", "1/4 node (2 of 8 GPUs, 24 of 96 cores, "
                                                                 f"{int(720e3 / 4 * 0.95)}M), shared")},
        ("cpu", True): {2: (True, "0", "whole node, exclusive (slurm.exclusive: true)"),
                        1: (True, "7600M", "1/2 node (1 of 2 workers, 48 of 96 cores, 7600M), exclusive "
                                           "(slurm.exclusive: true)")},
        # forced sharing: a whole node asks for the inventory's memory, so SLURM can place a job beside it
        ("cpu", False): {2: (False, "15200M", "whole node, shared (slurm.exclusive: false)"),
                         1: (False, "7600M", "1/2 node (1 of 2 workers, 48 of 96 cores, 7600M), shared "
                                             "(slurm.exclusive: false)")},
    }
    for (partition, excl), want in cases.items():
        out = tmp_path / f"{partition}-{excl}"
        out.mkdir()
        dirs = render(out, inv, {"batch_size": 8, "model_name": "smollm2-135m"}, {"number_gpus": sorted(want)},
                      partition=partition, slurm=None if excl is None else {"exclusive": excl})
        assert len(dirs) == len(want)
        for jd in dirs:
            share = spec_share(jd)
            exclusive, mem, text = want[share["devices"]]
            d = directives(jd)
            assert ("exclusive" in d) == exclusive and d["mem"] == mem and share["text"] == text, (d, share)
            assert share["exclusive"] == exclusive and share["cpus"] == int(d["cpus-per-task"])


def test_plan_shows_each_points_share(cli, tmp_path: Path) -> None:
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({"campaign": "x", "experiment": "finetune_full_benchmark-v1.0.0",
                                     "partition": "cpu", "grid": {"number_gpus": [1, 2]},
                                     "entity": {"model_name": "smollm2-135m", "model_max_length": 64,
                                                "batch_size": 2}}))
    res = cli("plan", sweep, "-i", TEST_INVENTORY)
    assert res.exit_code == 0, res.output
    assert "node share" in res.output and "1/2, shared" in res.output and "whole, exclusive" in res.output
    assert "node share of 1 run(s): 1/2 node (1 of 2 workers, 48 of 96 cores, 7600M), shared" in res.output
    assert "slurm.exclusive: true" in res.output  # how to isolate the partial-node point too
    doc = json.loads(cli("plan", sweep, "-i", TEST_INVENTORY, "--json").stdout)
    assert sorted(p["node_share"]["exclusive"] for p in doc) == [False, True]


def test_inventory_and_slurm_disagreements_are_named_in_either_direction(tmp_path: Path) -> None:
    asked: list[list[str]] = []

    def sinfo(argv):
        asked.append(list(argv))
        return subprocess.CompletedProcess(argv, 0, "node1|96|1000000|gpu:4\nnode2|96|1000000|gpu:8\n", "")

    def fit_of(inv_path: Path, partition: str) -> list[str]:
        inv = load_inventory(inv_path)
        sweep = parse_sweep({"campaign": "x", "experiment": "finetune_full_benchmark-v1.0.0", "partition": partition,
                             "entity": {"model_name": "smollm2-135m", "model_max_length": 64, "batch_size": 8,
                                        "number_gpus": 2}}, "x.yaml", tmp_path)
        points = [p for p in plan_sweep(sweep, inv) if p.valid]
        specs = render_points(sweep, inv, points, tmp_path / f"out-{len(asked)}")
        return cluster_fit(inv, sweep, points, Slurm(sinfo)).check(specs, inv)

    # fewer cores and less memory than SLURM knows (the nodes can run other jobs beside a point)
    notes = fit_of(inventory(tmp_path, cpus_per_node=2), "cpu")
    (cores,) = [n for n in notes if "cores" in n]
    assert cores.startswith("inventory and SLURM disagree about node1, node2:") and "CPUTot=96" in cores
    assert "says 2 cores" in cores and "fix: cpus_per_node: 96" in cores and "--exclusive" in cores
    (mem,) = [n for n in notes if "RealMemory" in n and "disagree" in n]
    assert "16 GB" in mem and "fix: memory_gb: 1000" in mem
    # one question to SLURM about the nodes per command, and one about the user's per-job limits
    assert [a[:2] for a in asked] == [["sinfo", "-h"], ["scontrol", "show"]]
    # more than SLURM has, on a GPU partition: cores, and GPUs on the host whose Gres says 4
    notes = fit_of(inventory(tmp_path, cpus_per_node=128, memory_gb=1000), "gpu")
    (cores,) = [n for n in notes if "disagree" in n and "cores" in n]
    assert "says 128 cores" in cores and "cannot be granted" in cores
    (gpus,) = [n for n in notes if "disagree" in n and "GPUs" in n]
    assert gpus.startswith("inventory and SLURM disagree about node1:") and "Gres says 4" in gpus
    assert not [n for n in notes if "disagree" in n and "memory" in n]  # 1000 GB = RealMemory 1000000 MB


@pytest.mark.slurm
def test_render_warns_when_the_test_cluster_has_more_cores_than_the_inventory(cli, slurm_cluster,
                                                                             tmp_path: Path) -> None:
    inv = inventory(tmp_path, cpus_per_node=4)
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({"campaign": "x", "experiment": "finetune_full_benchmark-v1.0.0",
                                     "partition": "cpu", "grid": {"number_gpus": [1, 2]},
                                     "entity": {"model_name": "smollm2-135m", "model_max_length": 64,
                                                "batch_size": 2}}))
    res = cli("render", sweep, "-i", inv, "-o", tmp_path / "out")
    assert res.exit_code == 0, res.output
    assert "inventory and SLURM disagree about node1, node2: the inventory says 4 cores" in res.output
    assert "CPUTot=96" in res.output
    # the controller accepts the whole-node point's --exclusive and the partial one's share
    for jd in (p.parent for p in (tmp_path / "out").glob("*/job.sbatch")):
        proc = subprocess.run(["sbatch", "--test-only", str(jd / "job.sbatch")], capture_output=True, text=True)
        assert proc.returncode == 0 and "to start at" in proc.stderr, proc.stderr
