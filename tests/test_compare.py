"""sbench compare: pairing by point, the bootstrap interval, verdicts, and a real slowdown caught."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.contract.errors import InputError
from harness.report.compare import compare, parse_side

from .conftest import ROOT, SMALL_DATASET, write_sweep


def side(values: dict[str, list[float]], metric: str = "dataset_tokens_per_second") -> dict[str, list[dict]]:
    return {pid: [{metric: v, "model_name": "tiny", "number_gpus": 1, "batch_size": 2} for v in vs]
            for pid, vs in values.items()}


def test_verdicts_follow_size_and_spread() -> None:
    base = side({"a": [100, 102, 98, 101], "b": [50, 51, 49], "c": [10, 10.5, 9.5], "d": [7.0]})
    cand = side({"a": [70, 71, 69, 72], "b": [50.5, 49, 51], "c": [14, 13.5, 14.5], "d": [5.0], "e": [1.0]})
    rows = {r.point_id: r for r in compare(base, cand, ["dataset_tokens_per_second"], 0.05)}
    assert set(rows) == {"a", "b", "c", "d"}  # e is only in CAND: nothing to pair
    assert rows["a"].verdict == "regression" and rows["a"].ratio == pytest.approx(70.5 / 100.5)
    assert rows["a"].high < 1 and rows["a"].n_base == 4
    assert rows["b"].verdict == "noise" and rows["b"].low <= 1 <= rows["b"].high
    assert rows["c"].verdict == "improvement"
    assert rows["d"].verdict == "regression (1 run)" and rows["d"].low == rows["d"].high == pytest.approx(5 / 7)


def test_a_large_but_unclear_change_is_noise_and_lower_is_better_metrics_flip() -> None:
    # medians differ by 10 %, but the repeats spread far wider than that: not a regression
    base = side({"a": [100, 60, 140, 90, 120]})
    cand = side({"a": [90, 150, 55, 85, 110]})
    (row,) = compare(base, cand, ["dataset_tokens_per_second"], 0.05)
    assert row.ratio < 0.95 and row.verdict == "noise"
    slow = side({"a": [10.0, 10.2, 9.9]}, "train_runtime")
    slower = side({"a": [13.0, 13.1, 12.8]}, "train_runtime")
    (rt,) = compare(slow, slower, ["train_runtime"], 0.05)
    assert rt.ratio > 1.2 and rt.verdict == "regression"


def test_bad_arguments_are_input_errors() -> None:
    assert parse_side("nightly-1") == ("nightly-1", {})
    assert parse_side("git_commit=abc,torch=2.13.0,campaign=n") == ("n", {"git_commit": "abc", "torch": "2.13.0"})
    for text in ("../x", "git_commit=", "a=b,=c"):
        with pytest.raises(InputError):
            parse_side(text)
    with pytest.raises(InputError, match="not comparable"):
        compare(side({"a": [1]}), side({"a": [1]}), ["loss"], 0.05)
    with pytest.raises(InputError, match="threshold"):
        compare(side({"a": [1]}), side({"a": [1]}), ["dataset_tokens_per_second"], 5)


@pytest.mark.train
def test_a_real_slowdown_is_flagged_and_the_same_configuration_is_not(tiny_model: Path, small_data_dir: Path,
                                                                      tmp_path: Path) -> None:
    runs, db = tmp_path / "runs", tmp_path / "r.duckdb"
    common = ["--workdir", str(runs), "--db", str(db)]

    def sbench(*args, env=None, ok=(0,)) -> subprocess.CompletedProcess:
        proc = subprocess.run([sys.executable, "-m", "harness", *map(str, args)], capture_output=True, text=True,
                              cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
        assert proc.returncode in ok, proc.stdout + proc.stderr
        return proc

    # The slowdown travels in the inventory's env (rendered into env/<host>.sh), so it reaches exactly the
    # jobs of that campaign whichever local queue worker runs them. Same partition: the same points. It is
    # 12 s inside a training window of about a second: on this shared machine a busy neighbour can stretch
    # a window several times, so only a difference far larger than that is one a test may demand to see.
    for name, fault in (("base", None), ("same", None), ("slow", "sleep@step=4:4;sleep@step=8:4;sleep@step=12:4")):
        inv = write_sweep(tmp_path / f"{name}-inv.yaml", {"cluster": "c", "partitions": {"cpu": {
            "gpu_model": "cpu", "gpus_per_node": 1, "cpus_per_node": 2, "memory_gb": 8,
            "env": {"SBENCH_FAULT": fault} if fault else {}, "hosts": {"h1": {"address": "127.0.0.1"}}}}})
        sw = write_sweep(tmp_path / f"{name}.yaml", {
            "campaign": name, "experiment": "finetune_full_benchmark-v1.0.0", "repeats": 2,
            "entity": {"model_name": "tiny", "model_max_length": 64, "dataset_id": SMALL_DATASET, "number_gpus": 1,
                       "batch_size": 2, "gradient_accumulation_steps": 1, "max_steps": 16},
            "model_map": {"tiny": str(tiny_model)}, "data_dir": str(small_data_dir)})
        sbench("submit", sw, "-i", inv, "--executor", "local", "--wait", "--force", *common)
    sbench("collect", *common)
    flagged = sbench("compare", "base", "slow", "--db", db, "--json", ok=(1,))
    (row,) = json.loads(flagged.stdout)["rows"]
    assert row["verdict"] == "regression" and row["ratio"] < 0.9 and row["n_base"] == row["n_cand"] == 2
    # Two campaigns of the same configuration differ only by this shared 2-core machine's noise, which for
    # a tiny model's sub-second training windows can reach a factor of two under load: no regression at 80 %
    # (the injected slowdown above is more than ten times).
    same = sbench("compare", "base", "same", "--db", db, "--threshold", "0.8")
    assert "0 regression(s)" in same.stdout

    # References gate a campaign: the slow one's training time against the base's slowest run plus 1.5 s
    # (the injected sleeps add 12 s), its dataset rate against nothing it could miss.
    import duckdb
    import yaml

    with duckdb.connect(str(db), read_only=True) as con:
        base_rt = max(r[0] for r in con.execute("SELECT train_runtime FROM measurements WHERE campaign = 'base'")
                      .fetchall())
    refs = {"train_runtime": {"value": base_rt, "upper": 1.5 / base_rt},
            "dataset_tokens_per_second": [{"value": 1.0, "lower": 0.5, "model_name": "tiny"},
                                          {"value": 1e12, "lower": 0.01}]}
    for name in ("base", "slow"):
        doc = yaml.safe_load((tmp_path / f"{name}.yaml").read_text())
        doc["references"] = refs
        sw = write_sweep(tmp_path / f"{name}.yaml", doc)
        out = sbench("submit", sw, "-i", tmp_path / f"{name}-inv.yaml", "--executor", "local", *common)
        assert f"campaign {name}: 0 attempt(s) submitted" in out.stdout
    sbench("collect", *common)
    ok = json.loads(sbench("check", "base", "--db", db, "--json").stdout)
    assert ok["ok"] and ok["counts"] == {"pass": 4, "fail": 0, "missing": 0, "shared": 0}
    # the more specific entry (model_name: tiny) applied, not the unreachable 1e12
    assert {c["reference"] for c in ok["checks"] if c["metric"] == "dataset_tokens_per_second"} == {1.0}
    bad = sbench("check", "slow", "--db", db, ok=(1,))
    assert "2 pass, 2 fail, 0 missing" in bad.stdout
    assert all(line.startswith("fail") for line in bad.stdout.splitlines() if "train_runtime" in line)
    # The report shows both: the checks table and the compare plot (a regression marker in red).
    page = sbench("report", "--db", db, "--compare", "base", "slow", "-o", "-").stdout
    assert 'id="checks"' in page and "slow: 2 pass, 2 fail, 0 missing" in page
    assert 'id="compare"' in page and "1 regression." in page and 'fill="#d62728"' in page.split('id="compare"')[1]
