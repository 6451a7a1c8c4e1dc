"""Campaign semantics, end to end with the local executor and real training of the tiny model: a campaign
measures its own points, so two campaigns of one sweep compare (the README's ``sbench compare
nightly-1122 nightly-1123``); taking another campaign's measurement instead is opt-in and names the run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from .conftest import SMALL_DATASET, sql_rows, write_sweep

pytestmark = pytest.mark.train


@pytest.fixture(scope="module")
def cli():
    from click.testing import CliRunner

    from harness.cli import main

    runner = CliRunner()

    def run(*args, code: int | tuple[int, ...] = 0):
        res = runner.invoke(main, [str(a) for a in args], catch_exceptions=False)
        assert res.exit_code in ((code,) if isinstance(code, int) else code), res.output
        return res

    return run


@pytest.fixture(scope="module")
def nightly(tmp_path_factory, tiny_model, small_data_dir, cli):
    """One sweep (campaign: nightly-1, two points), submitted as itself and as nightly-2, then collected."""
    root = tmp_path_factory.mktemp("campaigns")
    common = ["--workdir", root / "runs", "--db", root / "r.duckdb"]
    sweep = write_sweep(root / "nightly.yaml", {
        "campaign": "nightly-1", "experiment": "finetune_full_benchmark-v1.0.0",
        "entity": {"model_name": "tiny", "model_max_length": 64, "dataset_id": SMALL_DATASET, "number_gpus": 1,
                   "gradient_accumulation_steps": 1, "max_steps": 4},
        "grid": {"batch_size": [2, 4]},
        "model_map": {"tiny": str(tiny_model)}, "data_dir": str(small_data_dir)})
    first = json.loads(cli("submit", sweep, "--executor", "local", "--wait", "--json", *common).stdout)
    cli("collect", *common)
    second = json.loads(cli("submit", sweep, "--campaign", "nightly-2", "--executor", "local", "--wait", "--json",
                            *common).stdout)
    cli("collect", *common)
    return {"root": root, "common": common, "sweep": sweep, "db": root / "r.duckdb", "first": first,
            "second": second}


def test_a_second_campaign_of_one_sweep_measures_every_point(nightly) -> None:
    assert nightly["first"]["campaign"] == "nightly-1" and nightly["first"]["submitted"] == 2
    second = nightly["second"]
    assert second["campaign"] == "nightly-2" and second["submitted"] == 2 and second["reused"] == 0
    assert [(p["action"], p["reason"], p["reused_from"]) for p in second["points"]] == [("submit", "new", None)] * 2
    runs = sql_rows(nightly["db"], "SELECT campaign, point_id, outcome, job_dir FROM runs ORDER BY campaign, point_id")
    assert [(r["campaign"], r["outcome"]) for r in runs] == [("nightly-1", "ok")] * 2 + [("nightly-2", "ok")] * 2
    # the same points, each measured in its own job dir under its own campaign
    assert [r["point_id"] for r in runs[:2]] == [r["point_id"] for r in runs[2:]]
    assert all("/nightly-2/" in r["job_dir"] for r in runs[2:])
    camps = sql_rows(nightly["db"], "SELECT campaign FROM campaigns ORDER BY 1")
    assert [c["campaign"] for c in camps] == ["nightly-1", "nightly-2"]


def test_compare_the_two_nights(nightly, cli) -> None:
    # exit 0 or 1: whether this loaded machine's noise crosses 10 % is not what is tested here
    res = cli("compare", "nightly-1", "nightly-2", "--db", nightly["db"], "--json", code=(0, 1))
    rows = json.loads(res.stdout)["rows"]
    m = {r["point_id"]: r["dataset_tokens_per_second"] for r in sql_rows(
        nightly["db"], "SELECT point_id, dataset_tokens_per_second FROM measurements WHERE campaign = 'nightly-1'")}
    n = {r["point_id"]: r["dataset_tokens_per_second"] for r in sql_rows(
        nightly["db"], "SELECT point_id, dataset_tokens_per_second FROM measurements WHERE campaign = 'nightly-2'")}
    assert sorted(r["point_id"] for r in rows) == sorted(m) == sorted(n)
    for r in rows:  # each point paired with itself, one run a side, the ratio the measurements' own
        assert (r["n_base"], r["n_cand"]) == (1, 1)
        assert r["ratio"] == pytest.approx(n[r["point_id"]] / m[r["point_id"]], rel=1e-9)
    text = cli("compare", "nightly-1", "nightly-2", "--db", nightly["db"], "--threshold", "0.99").stdout
    assert "2 comparison(s): 0 regression(s)" in text


def test_submitting_a_campaign_again_measures_only_what_it_lacks(nightly, cli) -> None:
    again = json.loads(cli("submit", nightly["sweep"], "--campaign", "nightly-2", "--executor", "local", "--json",
                           *nightly["common"]).stdout)
    assert again["submitted"] == 0
    done = "already measured in this campaign (attempt 1 ended ok)"
    assert all(p["action"] == "skip" and p["reason"].startswith(done) for p in again["points"])


def test_reuse_is_opt_in_and_names_the_campaign_and_run_it_took(nightly, cli) -> None:
    runs = {r["point_id"]: r["run_id"] for r in sql_rows(
        nightly["db"], "SELECT point_id, run_id FROM runs WHERE campaign = 'nightly-1'")}
    # the flag: nothing measured; each point takes the oldest measured run of it, nightly-1's
    res = cli("submit", nightly["sweep"], "--campaign", "search", "--reuse-measured", "--executor", "local",
              *nightly["common"])
    assert "campaign search: 0 attempt(s) submitted" in res.stdout
    assert "reused 2 measured run(s) of campaign(s) nightly-1" in res.stdout
    for pid, rid in runs.items():
        line = next(x for x in res.stdout.splitlines() if x.startswith(pid))
        assert f"reused run {rid} of campaign nightly-1 (ok)" in line
    # the sweep's key does the same, in JSON
    doc = yaml.safe_load(Path(nightly["sweep"]).read_text())
    reusing = write_sweep(nightly["root"] / "search.yaml", {**doc, "campaign": "search-2", "reuse": "measured"})
    rep = json.loads(cli("submit", reusing, "--executor", "local", "--json", *nightly["common"]).stdout)
    assert rep["submitted"] == 0 and rep["reused"] == 2
    assert {p["point_id"]: p["reused_from"] for p in rep["points"]} == {
        pid: {"campaign": "nightly-1", "run_id": rid, "outcome": "ok"} for pid, rid in runs.items()}
    # nothing was queued for either: no attempt of theirs in the manifest or the database
    assert not sql_rows(nightly["db"], "SELECT * FROM runs WHERE campaign IN ('search', 'search-2')")
    # a bad --campaign is refused before anything is written
    bad = cli("submit", nightly["sweep"], "--campaign", "../x", "--executor", "local", *nightly["common"], code=2)
    assert "is not a campaign name" in bad.output
