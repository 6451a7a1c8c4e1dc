"""Energy: the sampler's running totals of the GPUs' NVML counters and the CPU packages' RAPL counters (a
reset, a wrap-around, a device without a counter), collect's energy over the measured window recomputed
independently from the job-dir files, an older samples file without the column, and SLURM's
ConsumedEnergyRaw."""

from __future__ import annotations

import csv
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from harness.collect import collect
from harness.contract.formats import SAMPLE_CSV_NAMES, SAMPLE_CSV_OLDEST, sample_csv_names_of
from harness.runner.sampler import EnergyCounter, FakeNvml, GpuBackend, NvmlBackend, RaplReader, Sampler
from harness.slurm.client import Slurm
from harness.slurm.sacct import SACCT_FORMAT, parse_energy, parse_sacct, parse_sacct_records

from .kit import FULL, jobdirs, one, rows_of
from .kit.jobdirs import CAMPAIGN, FakeSlurm, sacct_slot, write_attempt

RANGE_UJ = 262_143_328_850  # a real package's max_energy_range_uj


def csv_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


# -- the sampler: NVML --------------------------------------------------------------------------------------

def test_nvml_counter_reset_is_counted_from_the_reset_never_negative() -> None:
    # GPU 1's driver reloads after its 3rd reading: its counter starts again from 0 mJ.
    backend = NvmlBackend(FakeNvml(2, reset_after={1: 3}), use_env=False)
    readings = [backend.read() for _ in range(6)]
    raw = FakeNvml(2, reset_after={1: 3})
    counters = [[raw.nvmlDeviceGetTotalEnergyConsumption(h) for _ in range(6)] for h in (0, 1)]
    assert counters[1][3] < counters[1][2]  # the fake really resets
    for h in (0, 1):
        totals = [r[h]["energy_j"] for r in readings]
        # independently: each step's increase is the counter's rise, or after a reset its value since the reset
        expected, total = [0.0], 0
        for a, b in zip(counters[h], counters[h][1:]):
            total += b - a if b >= a else b
            expected.append(total / 1000)
        assert totals == expected
        assert all(b >= a for a, b in zip(totals, totals[1:]))
    assert readings[-1][1]["energy_j"] == 5 * 110.0  # 110 W for five one-second steps, the reset included


def test_a_gpu_without_the_energy_counter_writes_an_empty_energy(tmp_path: Path) -> None:
    path = tmp_path / "samples.node1.csv"
    s = Sampler(path, 0.05, NvmlBackend(FakeNvml(2, no_energy={0}), use_env=False))
    for _ in range(3):
        s.tick()
    s.stop()
    rows = csv_rows(path)
    assert [r["energy_j"] for r in rows if r["device"] == "0"] == ["", "", ""]
    assert [r["energy_j"] for r in rows if r["device"] == "1"] == ["0", "110", "220"]
    assert [r["power_w"] for r in rows if r["device"] == "0"] == ["100"] * 3  # the rest of the row is there


def test_energy_counter_ignores_missing_readings() -> None:
    c = EnergyCounter(1000)
    assert [c.update(v) for v in (5000, None, "x", 7500, 1000)] == [0.0, None, None, 2.5, 3.5]
    assert c.resets == 1


# -- the sampler: RAPL --------------------------------------------------------------------------------------

def powercap(root: Path, zones: dict[str, dict[str, Any]]) -> Path:
    """A fake powercap tree: zone directory -> its files."""
    for zone, files in zones.items():
        d = root / zone
        d.mkdir(parents=True)
        for name, value in files.items():
            if value is IsADirectoryError:
                (d / name).mkdir()  # a file that cannot be read as one
            else:
                (d / name).write_text(f"{value}\n")
    return root


def set_uj(root: Path, zone: str, value: int) -> None:
    (root / zone / "energy_uj").write_text(f"{value}\n")


def test_rapl_reads_packages_only_and_accounts_a_wrap_around(tmp_path: Path, monkeypatch) -> None:
    root = powercap(tmp_path / "powercap", {
        "intel-rapl:0": {"name": "package-0", "energy_uj": RANGE_UJ - 3_000_000, "max_energy_range_uj": RANGE_UJ},
        "intel-rapl:0:0": {"name": "core", "energy_uj": 5, "max_energy_range_uj": RANGE_UJ},  # inside package 0
        "intel-rapl:1": {"name": "package-1", "energy_uj": 10_000_000, "max_energy_range_uj": RANGE_UJ},
        "intel-rapl:2": {"name": "psys", "energy_uj": 1, "max_energy_range_uj": RANGE_UJ},  # the packages again
    })
    monkeypatch.setenv("SBENCH_POWERCAP", str(root))
    rapl = RaplReader()  # the root from SBENCH_POWERCAP
    assert [z[0] for z in rapl.zones] == [0, 1] and rapl.note() is None
    assert rapl.read() == [(0, 0.0), (1, 0.0)]
    set_uj(root, "intel-rapl:0", RANGE_UJ - 1_000_000)  # +2 J
    set_uj(root, "intel-rapl:1", 12_500_000)  # +2.5 J
    assert rapl.read() == [(0, 2.0), (1, 2.5)]
    set_uj(root, "intel-rapl:0", 4_000_000)  # wrapped: 1 J to the range, then 4 J
    set_uj(root, "intel-rapl:1", 12_500_001)
    assert rapl.read() == [(0, 7.0), (1, 2.500001)]
    assert rapl.zones[0][2].wraps == 1 and rapl.zones[1][2].wraps == 0


def test_rapl_unreadable_or_absent_gives_no_rows_and_says_why(tmp_path: Path) -> None:
    root = powercap(tmp_path / "pc", {"intel-rapl:0": {"name": "package-0", "energy_uj": IsADirectoryError}})
    rapl = RaplReader(root)
    assert rapl.zones == [] and rapl.read() == [] and "unreadable" in (rapl.note() or "")
    assert "no RAPL package zone" in (RaplReader(tmp_path / "nothing").note() or "")


def test_sampler_writes_cpu_rows_and_a_last_reading_when_it_stops(tmp_path: Path) -> None:
    root = powercap(tmp_path / "pc", {"intel-rapl:0": {"name": "package-0", "energy_uj": 1_000,
                                                       "max_energy_range_uj": RANGE_UJ}})
    path = tmp_path / "samples.node1.csv"
    s = Sampler(path, 0.05, GpuBackend(), rapl=RaplReader(root)).start()
    time.sleep(0.3)
    ticks_before_stop = s.ticks
    set_uj(root, "intel-rapl:0", 3_501_000)  # read by the last tick at the latest
    n = s.stop()
    rows = csv_rows(path)
    assert n == len(rows) == s.rows and s.ticks >= ticks_before_stop + 1
    rows = [r for r in rows if r["kind"] != "host"]  # the host's other load, beside the packages
    assert {r["kind"] for r in rows} == {"cpu"} and {r["device"] for r in rows} == {"0"}
    assert rows[0]["energy_j"] == "0" and rows[-1]["energy_j"] == "3.5"
    assert all(r["cpu_pct"] == "" and r["power_w"] == "" for r in rows)


# -- the samples header -------------------------------------------------------------------------------------

def test_an_older_samples_header_names_its_prefix() -> None:
    assert sample_csv_names_of(",".join(SAMPLE_CSV_NAMES) + "\n") == SAMPLE_CSV_NAMES
    old = ",".join(SAMPLE_CSV_NAMES[:SAMPLE_CSV_OLDEST])
    assert sample_csv_names_of(old + "\r\n") == SAMPLE_CSV_NAMES[:SAMPLE_CSV_OLDEST]
    assert SAMPLE_CSV_NAMES[SAMPLE_CSV_OLDEST - 1] == "nprocs"
    assert sample_csv_names_of("t_wall,kind") == SAMPLE_CSV_NAMES  # anything else: the current columns


# -- collect ------------------------------------------------------------------------------------------------

def interpolated(rows: list[dict[str, Any]], t: float) -> float:
    """The running total at *t*: recomputed here from the rows of one device, sorted by time."""
    for a, b in zip(rows, rows[1:]):
        if float(a["t_wall"]) == t:
            return float(a["energy_j"])
        if float(a["t_wall"]) < t <= float(b["t_wall"]):
            ta, tb, ea, eb = (float(a["t_wall"]), float(b["t_wall"]), float(a["energy_j"]), float(b["energy_j"]))
            return eb if tb == t else ea + (eb - ea) * (t - ta) / (tb - ta)
    raise AssertionError(f"no readings around {t}")


def window_energy(job_dir: Path, kind: str = "gpu") -> float:
    """The measured window's energy, from the job dir's files alone: rank 0's window, each device's
    readings in samples.<host>.csv interpolated at its edges."""
    rank0 = json.loads((job_dir / "rank.0.json").read_text())
    start, end = rank0["train_start_wall"], rank0["train_end_wall"]
    total = 0.0
    for path in sorted(job_dir.glob("samples.*.csv")):
        by_dev: dict[str, list[dict[str, str]]] = {}
        for r in csv_rows(path):
            if r["kind"] == kind and r["energy_j"] != "":
                by_dev.setdefault(r["device"], []).append(r)
        for rows in by_dev.values():
            rows.sort(key=lambda r: float(r["t_wall"]))
            total += interpolated(rows, end) - interpolated(rows, start)
    return total


class EnergySlurm(FakeSlurm):
    """sacct in the current format, with a ConsumedEnergyRaw per job (empty: not gathered)."""

    def __init__(self, jobs: dict[str, tuple[str, str, str, str]]) -> None:
        super().__init__()
        self.energy_jobs = jobs

    def __call__(self, argv):
        if argv[0] != "sacct":
            return super().__call__(argv)
        self.calls.append(list(argv))
        assert f"--format={SACCT_FORMAT}" in argv
        lines = []
        for j in argv[argv.index("-j") + 1].split(","):
            if j in self.energy_jobs:
                state, code, nodes, energy = self.energy_jobs[j]
                start, end = sacct_slot(j)
                lines.append(f"{j}|{state}|{code}|00:10:00||{nodes}|{start}|{end}|{start}|{energy}|sbench.c1.x")
                lines.append(f"{j}.0|{state}|{code}|00:10:00|2097152K|{nodes}|{start}|{end}|{start}|7|0")
        return subprocess.CompletedProcess(argv, 0, "\n".join(lines) + "\n", "")


def test_collect_stores_the_windows_energy_equal_to_a_recomputation(tc_wd: Path, tmp_path: Path) -> None:
    # Two hosts of two GPUs; the window's edges fall between samples (interpolated), one GPU's counter reset
    # mid-run (the sampler's total keeps rising, as written).
    run = write_attempt(tc_wd, 80, hosts=("node1", "node2"), t_train0=jobdirs.T0 + 4.25, t_train1=jobdirs.T0 + 14.6)
    other = write_attempt(tc_wd, 81, t_train0=jobdirs.T0 + 3.5, t_train1=jobdirs.T0 + 15.0)
    db = tmp_path / "r.duckdb"
    rep = collect(db, tc_wd, slurm=Slurm(EnergySlurm({run["job_id"]: ("COMPLETED", "0:0", "node[1-2]", "123456"),
                                                     other["job_id"]: ("COMPLETED", "0:0", "node1", "")})))
    assert rep.outcomes == {"ok": 2}
    assert rep.sample_rows == sum(len(r) for x in (run, other) for r in x["rows"].values())
    m = one(db, "SELECT * FROM measurements WHERE run_id = ?", [run["run_id"]])
    energy = window_energy(run["paths"].root)
    assert energy > 0
    assert m["energy_source"] == "nvml" and m["energy_joules"] == pytest.approx(energy, rel=1e-12)
    assert m["gpu_energy_joules"] == m["energy_joules"]  # the GPUs' counter: the same figure
    tokens = json.loads(run["paths"].rank_result(0).read_text())["metrics"]["dataset_tokens"]
    assert m["dataset_tokens_per_joule"] == pytest.approx(tokens / energy, rel=1e-12)
    assert m["slurm_consumed_energy_joules"] == 123456.0
    o = one(db, "SELECT * FROM measurements WHERE run_id = ?", [other["run_id"]])
    assert o["energy_joules"] == pytest.approx(window_energy(other["paths"].root), rel=1e-12)
    assert o["slurm_consumed_energy_joules"] is None  # energy accounting off: NULL, not 0
    assert not [n for n in (m["notes"] or []) + (o["notes"] or []) if "energy" in n]
    # the samples view shows the column as written
    got = rows_of(db, "SELECT energy_j FROM samples JOIN runs USING (run_id) WHERE runs.run_id = ? AND "
                         "host = 'node2' AND kind = 'gpu' AND device = 1 ORDER BY t_wall", [run["run_id"]])
    assert [g[0] for g in got] == [r["energy_j"] for r in run["rows"]["node2"] if r["kind"] == "gpu"
                                   and r["device"] == 1]


@pytest.fixture()
def tc_wd(tmp_path: Path) -> Path:
    d = tmp_path / "runs"
    d.mkdir()
    jobdirs.append_manifest(d, CAMPAIGN, [jobdirs.manifest_events(CAMPAIGN, FULL)])
    return d


def test_a_gpu_without_a_counter_leaves_energy_null_with_a_note(tc_wd: Path, tmp_path: Path) -> None:
    rows = jobdirs.gen_samples(jobdirs.T0, 20, 2, seed=3)
    for r in rows:
        if r["kind"] == "gpu" and r["device"] == 1:
            r["energy_j"] = None  # NVML NotSupported
    run = write_attempt(tc_wd, 82, samples={"node1": rows})
    db = tmp_path / "r.duckdb"
    collect(db, tc_wd, slurm=Slurm(FakeSlurm({run["job_id"]: ("COMPLETED", "0:0", "node1")})))
    m = one(db, "SELECT energy_joules, gpu_energy_joules, energy_source, dataset_tokens_per_joule, notes "
                   "FROM measurements")
    assert (m["energy_joules"], m["gpu_energy_joules"], m["dataset_tokens_per_joule"]) == (None, None, None)
    assert m["energy_source"] == "nvml"
    assert ("GPU node1:1: no energy reading (NVML reports no counter, or the samples file predates energy_j); "
            "energy_joules NULL") in m["notes"]


def test_readings_that_stop_before_the_window_ends_leave_energy_null(tc_wd: Path, tmp_path: Path) -> None:
    rows = [r for r in jobdirs.gen_samples(jobdirs.T0, 20, 2, seed=4) if r["t_wall"] <= jobdirs.T0 + 10]
    run = write_attempt(tc_wd, 83, samples={"node1": rows}, t_train1=jobdirs.T0 + 12.5)
    db = tmp_path / "r.duckdb"
    collect(db, tc_wd, slurm=Slurm(FakeSlurm({run["job_id"]: ("COMPLETED", "0:0", "node1")})))
    m = one(db, "SELECT energy_joules, notes FROM measurements")
    assert m["energy_joules"] is None
    assert any("do not reach both ends of the measured window" in n for n in m["notes"])


def test_a_cpu_run_takes_the_rapl_rows(tc_wd: Path, tmp_path: Path) -> None:
    rows = []
    for i in range(20):
        t = jobdirs.T0 + i
        rows.append({"t_wall": t, "t_mono": 5000.0 + i, "kind": "proc", "device": -1, "cpu_pct": 100.0,
                     "mem_pct": 1.0, "rss_mb": 100.0, "nprocs": 2})
        for pkg in (0, 1):
            rows.append({"t_wall": t, "t_mono": 5000.0 + i, "kind": "cpu", "device": pkg,
                         "energy_j": round(i * (40.5 + pkg), 6)})
    run = write_attempt(tc_wd, 84, gpus_per_host=1, samples={"node1": rows}, t_train0=jobdirs.T0 + 2.2,
                           t_train1=jobdirs.T0 + 17.9)
    db = tmp_path / "r.duckdb"
    collect(db, tc_wd, slurm=Slurm(FakeSlurm({run["job_id"]: ("COMPLETED", "0:0", "node1")})))
    m = one(db, "SELECT energy_joules, gpu_energy_joules, energy_source, gpu_compute_utilization_avg "
                   "FROM measurements")
    assert m["energy_source"] == "rapl" and m["gpu_energy_joules"] is None  # RAPL's figure is no GPU's
    assert m["energy_joules"] == pytest.approx(window_energy(run["paths"].root, "cpu"), rel=1e-12)
    assert m["energy_joules"] == pytest.approx((17.9 - 2.2) * (40.5 + 41.5), rel=1e-6)  # constant power
    assert m["gpu_compute_utilization_avg"] == 0.0  # no GPU rows: the cpu rows are not GPUs


def test_an_older_samples_file_without_energy_still_collects(tc_wd: Path, tmp_path: Path) -> None:
    run = write_attempt(tc_wd, 85)
    path = run["paths"].samples("node1")
    old_names = SAMPLE_CSV_NAMES[:SAMPLE_CSV_OLDEST]
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    path.write_text("\n".join([",".join(old_names), *(",".join(r[k] for k in old_names) for r in rows)]) + "\n")
    new = write_attempt(tc_wd, 86)  # a current file beside it, in the same collect
    db = tmp_path / "r.duckdb"
    rep = collect(db, tc_wd, slurm=Slurm(FakeSlurm({run["job_id"]: ("COMPLETED", "0:0", "node1"),
                                                    new["job_id"]: ("COMPLETED", "0:0", "node1")})))
    assert rep.outcomes == {"ok": 2} and rep.sample_rows == len(rows) + sum(len(r) for r in new["rows"].values())
    m = one(db, "SELECT energy_joules, gpu_compute_utilization_avg, notes, r.warnings FROM measurements "
                   "JOIN runs r USING (run_id) WHERE run_id = ?", [run["run_id"]])
    assert m["energy_joules"] is None and m["gpu_compute_utilization_avg"] is not None
    assert "GPU node1:0, GPU node1:1: no energy reading" in " ".join(m["notes"])
    assert m["warnings"] == m["notes"]  # the note is the run's warning too: status counts it
    assert rows_of(db, "SELECT count(energy_j) FROM samples WHERE run_id = ?", [run["run_id"]]) == [(0,)]
    assert one(db, "SELECT energy_joules FROM measurements WHERE run_id = ?",
               [new["run_id"]])["energy_joules"] is not None


# -- sacct --------------------------------------------------------------------------------------------------

def test_consumed_energy_raw_is_parsed_in_every_format() -> None:
    assert [parse_energy(x) for x in ("123", "", "0", "x", str(2**64 - 2), " 7 ")] == [123.0, None, None, None,
                                                                                      None, 7.0]
    now = "2026-11-25T08:00:00"
    current = (f"77|COMPLETED|0:0|00:01:00||node1|{now}|{now}|{now}|5400|a|b\n"  # a job name with a '|'
               f"77.0|COMPLETED|0:0|00:01:00|10K|node1|{now}|{now}|{now}|5000|0\n"
               f"78|COMPLETED|0:0|00:01:00||node1|{now}|{now}|{now}||sbench.x\n")
    got = parse_sacct(current)
    assert got["77"].consumed_energy_j == 5400.0 and got["77"].name == "a|b"
    assert got["78"].consumed_energy_j is None and got["78"].name == "sbench.x"
    ten = parse_sacct_records(f"79|COMPLETED|0:0|00:01:00||node1|{now}|{now}|{now}|sbench.y\n")["79"][0]
    eight = parse_sacct_records(f"80|FAILED|1:0|00:01:00||node1|{now}|{now}\n")["80"][0]
    assert (ten.name, ten.consumed_energy_j, ten.submit is not None) == ("sbench.y", None, True)
    assert (eight.state, eight.name, eight.consumed_energy_j) == ("FAILED", None, None)
