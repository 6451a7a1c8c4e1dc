"""The node sampler: GPU backends (fake NVML), CUDA_VISIBLE_DEVICES matching, the process tree."""

from __future__ import annotations

import csv
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from harness.contract.formats import SAMPLE_CSV_NAMES
from harness.runner import sampler as smp
from harness.runner.sampler import (
    FakeNvml,
    NvmlBackend,
    ProcessTree,
    Sampler,
    match_visible,
    open_backend,
    parse_visible_devices,
)

BUSY = "import time\nt=time.time()\nwhile time.time()-t<30: pass\n"


def rows_of(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture
def busy():
    """A process that keeps one core busy; killed afterwards."""
    procs = []

    def start(code: str = BUSY) -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, "-c", code])
        procs.append(p)
        return p

    yield start
    for p in procs:
        for c in psutil.Process(p.pid).children(recursive=True) if p.poll() is None else []:
            c.kill()
        p.kill()
        p.wait()


# -- CUDA_VISIBLE_DEVICES -------------------------------------------------------------------

def test_visible_devices_parse_like_cuda():
    assert parse_visible_devices(None) is None
    assert parse_visible_devices("2,0") == ["2", "0"]
    assert parse_visible_devices("1,foo,2") == ["1"]  # CUDA stops at the first invalid entry
    assert parse_visible_devices("-1") == []
    assert parse_visible_devices("") == []
    assert parse_visible_devices("GPU-abc, 3") == ["GPU-abc", "3"]


def test_indices_follow_pci_bus_order_not_nvml_order():
    devs = [{"nvml_index": 0, "uuid": "GPU-b", "pci_bus_id": "00000000:81:00.0"},
            {"nvml_index": 1, "uuid": "GPU-a", "pci_bus_id": "00000000:01:00.0"}]
    assert [d["uuid"] for d in match_visible(devs, None)] == ["GPU-a", "GPU-b"]
    assert [d["uuid"] for d in match_visible(devs, ["1"])] == ["GPU-b"]
    assert match_visible(devs, ["5"]) == []


def test_fake_backend_respects_cuda_visible_devices_subset(monkeypatch, tmp_path):
    monkeypatch.setenv("SBENCH_SAMPLER_BACKEND", "fake")
    monkeypatch.setenv("SBENCH_FAKE_GPUS", "4")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    backend, note = open_backend()
    assert note is None and backend.name == "fake"
    assert [d.uuid for d in backend.devices()] == [FakeNvml.uuid(2), FakeNvml.uuid(0)]
    s = Sampler(tmp_path / "s.csv", 0.05, backend)
    s.tick()
    s.stop()
    rows = [r for r in rows_of(tmp_path / "s.csv") if r["kind"] != "host"]  # the host's load beside the GPUs
    assert [r["kind"] for r in rows] == ["gpu", "gpu"]
    by_dev = {r["device"]: r for r in rows}
    # device 0 is physical GPU 2: 3 GiB used, 120 W of a 402 W limit
    assert float(by_dev["0"]["mem_used_mb"]) == 3072 and float(by_dev["0"]["power_w"]) == 120
    assert float(by_dev["0"]["power_limit_w"]) == 402 and float(by_dev["0"]["mem_total_mb"]) == 80 * 1024
    assert float(by_dev["1"]["mem_used_mb"]) == 1024 and float(by_dev["1"]["power_limit_w"]) == 400
    assert by_dev["0"]["cpu_pct"] == "" and by_dev["0"]["nprocs"] == ""


def test_fake_backend_matches_uuids_and_limits_to_devices_in_use(monkeypatch):
    monkeypatch.setenv("SBENCH_FAKE_GPUS", "4")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"{FakeNvml.uuid(3)},{FakeNvml.uuid(1)},{FakeNvml.uuid(0)}")
    backend, _ = open_backend("fake", max_devices=2)
    assert [d.nvml_index for d in backend.devices()] == [3, 1]
    assert [d.index for d in backend.devices()] == [0, 1]
    assert [d.nvml_index for d in backend.visible_devices()] == [3, 1, 0]
    # An ambiguous UUID prefix is rejected by CUDA, and so everything after it.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-fa4e0000,1")
    backend, _ = open_backend("fake")
    assert backend.devices() == []


def test_nvml_missing_falls_back_to_no_gpu_rows(monkeypatch):
    monkeypatch.delenv("SBENCH_SAMPLER_BACKEND", raising=False)

    class Broken(FakeNvml):
        def nvmlInit(self):
            raise OSError("NVML Shared Library Not Found")

    monkeypatch.setitem(smp.BACKENDS, "nvml", lambda max_devices=None: NvmlBackend(Broken(2)))
    backend, note = open_backend()
    assert backend.name == "none" and backend.devices() == [] and "NVML Shared Library Not Found" in note


def test_unknown_backend_is_an_error():
    with pytest.raises(ValueError, match="known: nvml, fake, none"):
        open_backend("bogus")


def test_fake_nvml_is_deterministic():
    a, b = NvmlBackend(FakeNvml(3)), NvmlBackend(FakeNvml(3))
    assert [a.read() for _ in range(3)] == [b.read() for _ in range(3)]
    assert a.read() != a.read()  # utilisation moves with every call


# -- the process tree ----------------------------------------------------------------------

def cpu_seconds(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def test_first_reading_only_primes_then_reports_real_cpu(busy):
    p = busy()
    proc = psutil.Process(p.pid)
    tree = ProcessTree(p.pid)
    assert tree.read() is None  # psutil's first reading is 0.0 by definition: never written
    c0, t0 = cpu_seconds(proc), time.monotonic()
    # the busy loop's own CPU time, read beside the tree's: long enough for it to run 0.2 CPU s, however
    # loaded the machine is (its share of a core is what the reading must say, not a fixed figure)
    deadline = t0 + 30
    while cpu_seconds(proc) - c0 < 0.2 and time.monotonic() < deadline:
        time.sleep(0.1)
    r = tree.read()
    expected = 100 * (cpu_seconds(proc) - c0) / (time.monotonic() - t0)
    assert r is not None and r["nprocs"] == 1
    assert r["cpu_pct"] > 0 and abs(r["cpu_pct"] - expected) <= max(5.0, 0.25 * expected), (r, expected)
    assert r["rss_mb"] > 1 and 0 < r["mem_pct"] < 100


def test_tree_includes_children_started_later(busy):
    # The parent idles, then starts a busy child: the child must be found and counted.
    parent = busy("import subprocess,sys,time\ntime.sleep(0.8)\n"
                  f"subprocess.Popen([sys.executable,'-c',{BUSY!r}]).wait()\n")
    tree = ProcessTree(parent.pid)
    assert tree.read() is None
    time.sleep(0.3)
    first = tree.read()
    assert first is not None and first["nprocs"] == 1 and first["cpu_pct"] < 30
    deadline = time.time() + 10
    while time.time() < deadline:
        time.sleep(0.5)
        r = tree.read()
        if r and r["nprocs"] == 2 and r["cpu_pct"] > first["cpu_pct"]:  # the busy child's CPU is counted
            break
    else:
        pytest.fail(f"busy child never counted: last reading {r}")


def test_sampler_rows_are_flushed_each_tick(busy, tmp_path):
    p = busy()
    path = tmp_path / "samples.csv"
    s = Sampler(path, 0.1, smp.GpuBackend(), root_pid=p.pid).start()
    try:
        deadline = time.monotonic() + 30
        live: list[dict[str, str]] = []
        while len(live) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
            live = rows_of(path)  # read while the sampler runs: rows are on disk already
        assert len(live) >= 3
    finally:
        n = s.stop()
    rows = rows_of(path)
    assert n == len(rows) == s.rows
    assert list(rows[0].keys()) == list(SAMPLE_CSV_NAMES)
    assert {r["kind"] for r in rows} <= {"proc", "host"} and all(r["device"] == "-1" for r in rows)
    host = [r for r in rows if r["kind"] == "host"]  # the host's other load: a share of its capacity
    assert host and all(0 <= float(r["cpu_pct"]) <= 100 for r in host)
    rows = [r for r in rows if r["kind"] == "proc"]
    # a busy loop: CPU in the readings (a starved tick of a loaded machine may read 0, never all of them)
    assert all(float(r["cpu_pct"]) >= 0 for r in rows) and any(float(r["cpu_pct"]) > 0 for r in rows)
    t = [float(r["t_wall"]) for r in rows]
    assert t == sorted(t)
    # on its grid of 0.1 s (a late tick is not made up for): never more ticks than the grid has slots, plus the last
    # reading stop() takes off the grid (the tree still runs)
    assert len(t) <= (t[-1] - t[0]) / 0.1 + 3


def test_sampler_survives_root_exit_and_appends(tmp_path, busy):
    path = tmp_path / "samples.csv"
    p = busy("import time; time.sleep(0.3)")
    s = Sampler(path, 0.05, smp.GpuBackend(), root_pid=p.pid)
    for _ in range(3):
        s.tick()
    p.wait()
    s.tick()  # the tree is gone: no row, no crash
    s.stop()
    before = len(rows_of(path))
    s2 = Sampler(path, 0.05, NvmlBackend(FakeNvml(1)))
    s2.tick()
    s2.stop()
    rows = rows_of(path)
    gpu = [r for r in rows[before:] if r["kind"] == "gpu"]
    assert len(gpu) == 1 and {r["kind"] for r in rows[before:]} <= {"gpu", "host"}  # appended, header not repeated
    assert path.read_text().count("t_wall,") == 1
