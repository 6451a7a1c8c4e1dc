"""sbench inventory discover: canned sinfo and `scontrol show node` output of 8 nodes (one call each), probes
read from the probe tests' fake sysfs tree, the written inventory accepted by `inventory check` and used by a
plan, hosts that differ from their partition called out, --against; and for real on the test cluster."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path

import pytest
import yaml

from harness.cluster.discover import changes, discover, render
from harness.contract.errors import InputError
from harness.runner.envcapture import read_hcas
from harness.slurm.client import Slurm
from harness.slurm.nodes import parse_nodes, parse_partitions
from harness.spec.inventory import load_inventory

from .kit import SMALL_DATASET, write_yaml
from .kit.sysfs import make_sysfs

NODE = """NodeName={name} Arch=x86_64 CoresPerSocket=32
   CPUAlloc=0 CPUEfctv={cpus} CPUTot={cpus} CPULoad=0.01
   AvailableFeatures={features}
   ActiveFeatures={features}
   Gres={gres}
   NodeAddr={addr} NodeHostName={name} Version=23.02.7
   OS=Linux 5.14.0-362.el9.x86_64 #1 SMP PREEMPT_DYNAMIC Tue Oct 3 2023
   RealMemory={mem} AllocMem=0 FreeMem=990000 Sockets=2 Boards=1
   State={state} ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A
   Partitions={parts}
   BootTime=2026-11-01T08:00:00 SlurmdStartTime=2026-11-01T08:01:00
   CfgTRES=cpu={cpus},mem={mem}M,billing={cpus},gres/gpu=8
   CurrentWatts=0 AveWatts=0
"""


def canned_nodes() -> str:
    """8 GPU nodes gpu-a01..a08 in partition a100 (a08 also in debug): a07 has 64 CPUs, a08 is down."""
    out = []
    for i in range(1, 9):
        out.append(NODE.format(name=f"gpu-a{i:02d}", cpus=64 if i == 7 else 128, mem=1024000,
                               gres="gpu:a100:8(S:0-1)", features="a100,ib", addr=f"10.0.1.{10 + i}",
                               state="DOWN+DRAIN" if i == 8 else "IDLE",
                               parts="a100,debug" if i == 8 else "a100"))
    return "\n".join(out)


SINFO = "a100|gpu-a[01-07]|2-00:00:00\na100|gpu-a08|2-00:00:00\ndebug|gpu-a08|30:00\n"


class Runner:
    """Answers sinfo, scontrol show node and scontrol show config; counts each call."""

    def __init__(self, nodes: str = "", sinfo: str = SINFO) -> None:
        self.nodes, self.sinfo, self.calls = nodes or canned_nodes(), sinfo, []

    def __call__(self, argv, **kw):
        self.calls.append(list(argv))
        out = {"sinfo": self.sinfo}.get(argv[0])
        if argv[:3] == ["scontrol", "show", "node"]:
            out = self.nodes
        elif argv[:3] == ["scontrol", "show", "config"]:
            out = "ClusterName = vela\nMaxArraySize = 1001\n"
        return subprocess.CompletedProcess(argv, 0, out or "", "")


def probe_of(ib: Path, name: str, gpus: int = 8) -> dict:
    return {"host": name, "gpus": [{"index": i, "name": "NVIDIA A100-SXM4-80GB", "uuid": f"GPU-{name}-{i}",
                                    "memory_gb": 79.2} for i in range(gpus)],
            "gpu_count": gpus, "hcas": read_hcas(ib), "memlock": "unlimited", "cores": 128, "memory_gb": 1031.9}


def test_scontrol_and_sinfo_are_parsed() -> None:
    nodes = parse_nodes(canned_nodes())
    assert len(nodes) == 8
    a1 = nodes["gpu-a01"]
    assert (a1.cpus, a1.memory_mb, a1.gpus, a1.gpu_type, a1.address) == (128, 1024000, 8, "a100", "10.0.1.11")
    assert a1.features == ("a100", "ib") and a1.partitions == ("a100",) and a1.usable
    assert not nodes["gpu-a08"].usable and nodes["gpu-a08"].partitions == ("a100", "debug")
    # -o: one line per node
    oneline = parse_nodes("\n".join(" ".join(r.split()) for r in canned_nodes().split("\n\n")))
    assert oneline == nodes
    parts = parse_partitions(SINFO)
    assert parts["a100"].nodes == tuple(f"gpu-a{i:02d}" for i in range(1, 9)) and parts["debug"].time_limit == "30:00"


def test_eight_nodes_make_an_inventory_check_accepts(tmp_path: Path, cli) -> None:
    ib = make_sysfs(tmp_path)
    runner = Runner()
    d = discover(Slurm(runner), ["a100"], False, tmp_path)
    # SLURM asked once each
    assert sum(c[0] == "sinfo" for c in runner.calls) == 1
    assert sum(c[:3] == ["scontrol", "show", "node"] for c in runner.calls) == 1
    # what a probe of every usable node found (the fake sysfs tree: mlx5_0:1 RoCE v2 at GID index 3)
    d.probed = True
    d.probes = {f"gpu-a{i:02d}": probe_of(ib, f"gpu-a{i:02d}") for i in range(1, 8)}
    d.not_probed = {"gpu-a08": "state DOWN+DRAIN"}
    text = render(d)
    out = tmp_path / "c.yaml"
    out.write_text(text)
    res = cli("inventory", "check", "-i", out, "--json")
    assert res.exit_code == 0, res.output
    inv = load_inventory(out)
    part = inv.partitions["a100"]
    assert inv.cluster == "vela" and sorted(part.hosts) == [f"gpu-a{i:02d}" for i in range(1, 8)]
    assert (part.gpu_model, part.gpus_per_node, part.cpus_per_node, part.memory_gb) == (
        "NVIDIA-A100-SXM4-80GB", 8, 64, 1024)
    assert part.time_limit == "2-00:00:00"
    a1 = part.hosts["gpu-a01"]
    assert a1.address == "10.0.1.11" and a1.roce is not None
    assert a1.roce.hcas == ("mlx5_0:1",) and a1.roce.gid_index == 3 and a1.roce.socket_ifname == "net1-0"
    # every node named with the CPUs and GRES SLURM reports; the odd ones called out
    for i in range(1, 8):
        assert f"# gpu-a{i:02d}: SLURM {64 if i == 7 else 128} CPUs, 1024000 MB, GRES gpu:a100:8(S:0-1)" in text
    assert "# DIFFERS from the rest of partition a100: CPUs 64 (the others: 128)" in text
    assert text.count("DIFFERS") == 1  # a07 alone
    # the down node is named, left out: its RoCE ports are unknown
    assert ("# gpu-a08 left out (not probed: state DOWN+DRAIN): SLURM 128 CPUs, 1024000 MB, GRES "
            "gpu:a100:8(S:0-1)") in text
    # a sweep planned against it is valid
    sweep = write_yaml(tmp_path / "s.yaml", {
        "campaign": "d", "experiment": "finetune_lora_benchmark-v1.0.0", "partition": "a100",
        "entity": {"model_name": "smollm2-135m", "model_max_length": 512, "dataset_id": SMALL_DATASET,
                   "batch_size": 8, "number_gpus": 8, "number_nodes": 2, "enable_roce": True}})
    plan = cli("plan", sweep, "-i", out, "--json")
    assert plan.exit_code == 0, plan.output
    (point,) = json.loads(plan.output)
    assert point["valid"] is True, point["reasons"]


def test_against_says_what_changed(tmp_path: Path) -> None:
    ib = make_sysfs(tmp_path)
    d = discover(Slurm(Runner()), ["a100"], False, tmp_path)
    d.probed = True
    d.probes = {f"gpu-a{i:02d}": probe_of(ib, f"gpu-a{i:02d}") for i in range(1, 8)}
    old_doc = yaml.safe_load(render(d))
    before = copy.deepcopy(old_doc)
    hosts = before["partitions"]["a100"]["hosts"]
    hosts["gpu-a09"] = {"address": "10.0.1.19"}  # a host SLURM no longer has
    hosts["gpu-a02"]["roce"] = {"hcas": ["mlx5_0:1", "mlx5_3:1"], "gid_index": 3}  # mlx5_3 is down now
    hosts["gpu-a03"]["roce"]["gid_index"] = 1  # the RoCE v2 IPv4 entry was at 1
    del hosts["gpu-a04"]  # new since
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(before))
    got = changes(load_inventory(tmp_path / "old.yaml"), d)
    assert "a100/gpu-a09: host gone (not in SLURM's partition)" in got
    assert "a100/gpu-a04: new host" in got
    assert "a100/gpu-a02: HCA mlx5_3:1 down (1: DOWN)" in got
    assert "a100/gpu-a03: RoCE v2 IPv4 GID index moved 1 -> 3" in got
    assert len(got) == 4, got
    (tmp_path / "same.yaml").write_text(yaml.safe_dump(old_doc))
    assert changes(load_inventory(tmp_path / "same.yaml"), d) == []


def test_an_unknown_partition_is_an_input_error_and_no_slurm_a_runtime_error(tmp_path: Path, cli,
                                                                             monkeypatch) -> None:
    with pytest.raises(InputError, match="--partition h100: SLURM has no such partition; it has a100, debug"):
        discover(Slurm(Runner()), ["h100"], False, tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))  # no sinfo here
    res = cli("inventory", "discover", "--on", "none")
    assert res.exit_code == 1 and "sinfo failed" in res.output and "Traceback" not in res.output


@pytest.mark.slurm
@pytest.mark.slow(20)
def test_discover_on_the_test_cluster_writes_an_inventory_check_and_plan_accept(cli, slurm_cluster, tmp_path: Path,
                                                                                tiny_model: Path) -> None:
    out = tmp_path / "c.yaml"
    res = cli("inventory", "discover", "--on", "slurm", "-o", out, "--workdir", tmp_path / "runs",
              "--partition", "cpu", "--against", slurm_cluster["inventory"])
    assert res.exit_code == 0, res.output
    assert "2 probed" in res.output
    sinfo = subprocess.run(["scontrol", "show", "node"], capture_output=True, text=True, check=True).stdout
    nodes = parse_nodes(sinfo)
    check = cli("inventory", "check", "-i", out, "--json")
    assert check.exit_code == 0, check.output
    inv = load_inventory(out)
    part = inv.partitions["cpu"]
    assert sorted(part.hosts) == sorted(n for n in nodes if "cpu" in nodes[n].partitions)
    assert part.cpus_per_node == min(nodes[n].cpus or 0 for n in part.hosts)
    text = out.read_text()
    for n in part.hosts:
        assert f"# {n}: SLURM {nodes[n].cpus} CPUs, {nodes[n].memory_mb} MB, GRES {nodes[n].gres}" in text
        assert part.hosts[n].address == nodes[n].address
    # the test inventory names HCAs the namespaced nodes do not have
    assert "changed: cpu/node1: HCA mlx5_0:1 gone" in res.output
    sweep = write_yaml(tmp_path / "s.yaml", {
        "campaign": "disc", "experiment": "finetune_lora_benchmark-v1.0.0", "partition": "cpu",
        "entity": {"model_name": "tiny", "model_max_length": 64, "dataset_id": SMALL_DATASET, "batch_size": 2,
                   "number_gpus": 2, "number_nodes": 2}, "model_map": {"tiny": str(tiny_model)}})
    plan = cli("plan", sweep, "-i", out, "--json")
    assert plan.exit_code == 0, plan.output
    (point,) = json.loads(plan.output)
    assert point["valid"] is True, point["reasons"]
