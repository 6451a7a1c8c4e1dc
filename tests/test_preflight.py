"""sbench preflight without a cluster: each device's figures ranked against the partition's median, a device
slowed with SBENCH_FAULT flagged, the threshold from the option or the environment, bad input refused."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import duckdb
import pytest

from harness.cluster import preflight as pf
from harness.cluster.preflight import PreflightResult, confirm, default_threshold, rank_devices
from harness.contract.errors import InputError
from harness.db.store import open_store
from harness.runner.faults import FaultSpecError, parse_faults
from harness.runner.preflight import MATMUL, MEMCPY, preflight_node


def test_a_slowed_node_is_flagged_against_the_median(monkeypatch) -> None:
    # five clean nodes beside the slowed one: measured one after another on this loaded machine, a burst that
    # slows one or two clean nodes' figures as much as the injected 10x moves the median of six very little
    clean = ("a", "c", "d", "e", "f")
    docs = {h: preflight_node(h, gpu=False, budget_s=0.2) for h in clean[:2]}
    monkeypatch.setenv("SBENCH_FAULT", "slow@stage=preflight,host=b:10")
    docs["b"] = preflight_node("b", gpu=False, budget_s=0.2)
    docs.update({h: preflight_node(h, gpu=False, budget_s=0.2) for h in clean[2:]})  # the fault names b only
    assert docs["b"]["slow_fault"] == 10.0 and not any("slow_fault" in docs[h] for h in clean)
    rows = rank_devices(docs, "p1", "c", "cpu", 0.9)
    assert {r["figure"] for r in rows} == {MATMUL, MEMCPY} and len(rows) == 12
    for figure in (MATMUL, MEMCPY):
        got = {r["host"]: r for r in rows if r["figure"] == figure}
        mid = statistics.median(r["value"] for r in got.values())
        assert all(r["partition_median"] == mid and r["ratio"] == pytest.approx(r["value"] / mid)
                   for r in got.values())
        # the injected 10x: b is flagged, and under a third of the clean nodes' median
        assert got["b"]["flagged"] and got["b"]["ratio"] < 0.5, (figure, got["b"])
        assert got["b"]["value"] < statistics.median(got[h]["value"] for h in clean) / 3, figure
    for r in rows:
        assert r["unit"] == ("TFLOP/s" if r["figure"] == MATMUL else "GB/s") and len(r["reps"]) == 5
        assert r["dtype"] == "fp32" and r["device"] == "cpu"


def test_the_threshold_comes_from_the_environment_else_the_default(monkeypatch) -> None:
    monkeypatch.delenv("SBENCH_PREFLIGHT_THRESHOLD", raising=False)
    assert default_threshold() == 0.9
    monkeypatch.setenv("SBENCH_PREFLIGHT_THRESHOLD", "0.75")
    assert default_threshold() == 0.75
    monkeypatch.setenv("SBENCH_PREFLIGHT_THRESHOLD", "2")
    with pytest.raises(InputError, match=r"SBENCH_PREFLIGHT_THRESHOLD must be a share .* got '2'"):
        default_threshold()


def test_preflight_on_this_machine_records_its_figures(cli, tmp_path: Path) -> None:
    db = tmp_path / "r.duckdb"
    res = cli("preflight", "--seconds", "0.2", "--db", db, "--workdir", tmp_path / "runs", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert {r["figure"] for r in doc["rows"]} == {MATMUL, MEMCPY} and doc["slow_hosts"] == []
    assert all(r["ratio"] == 1.0 for r in doc["rows"])  # one device: it is its partition's median


@pytest.mark.parametrize(("args", "says"), [
    (["preflight", "--threshold", "1.5"], "Invalid value for '--threshold'"),
    (["preflight", "--seconds", "0"], "Invalid value for '--seconds'"),
    (["submit", "nosuch.yaml", "--exclude-slow"], "does not exist"),
])
def test_bad_options_are_usage_errors(cli, args, says) -> None:
    res = cli(*args)
    assert res.exit_code == 2 and says in res.output


def test_exclude_slow_needs_preflight(cli, tmp_path: Path) -> None:
    sweep = tmp_path / "s.yaml"
    sweep.write_text("campaign: c\n")
    res = cli("submit", sweep, "--exclude-slow")
    assert res.exit_code == 2 and "--exclude-slow leaves out the hosts that --preflight finds slow" in res.output


def test_hosts_and_preflight_answer_bad_input_and_an_empty_history_consistently(tmp_path: Path, cli) -> None:
    missing, empty, hostless = tmp_path / "missing.duckdb", tmp_path / "empty.duckdb", tmp_path / "hostless.duckdb"
    duckdb.connect(str(empty)).close()  # a file with no sbench schema: no database yet, like a missing one
    open_store(hostless).close()  # the schema, no run
    for db in (missing, empty):
        for args in (["hosts", "--json"], ["hosts"]):
            res = cli(*args, "--db", db)
            assert res.exit_code == 2 and "run `sbench collect` first" in res.output and "{" not in res.output, \
                res.output
    res = cli("hosts", "--json", "--db", hostless)
    assert res.exit_code == 0 and json.loads(res.output) == {"drain_candidates": [], "hosts": []}
    assert "no drain candidate among 0 host(s)" in cli("hosts", "--db", hostless).output
    # a figure that is no number is an input error naming the option, not an internal error
    for args in (["preflight", "--seconds", "nan"], ["preflight", "--threshold", "nan"],
                 ["hosts", "--min-share", "nan"], ["compare", "a", "b", "--threshold", "inf"],
                 ["report", "--threshold", "nan"]):
        res = cli(*args, "--db", hostless)
        assert res.exit_code == 2 and "is not a finite number" in res.output and "internal error" not in res.output, \
            (args, res.output)


def test_only_a_device_slow_at_both_looks_is_condemned(monkeypatch) -> None:
    # five hosts, b slowed at the first look only (a neighbour's burst), c at both (ten times as long: far under
    # the threshold, whatever this machine's load does to the others): every host is measured again, the second
    # look ranked among itself, and only c stays flagged
    monkeypatch.setenv("SBENCH_FAULT", "slow@stage=preflight,host=b,look=1:10;slow@stage=preflight,host=c:10")
    docs = {h: preflight_node(h, gpu=False, budget_s=0.2) for h in "abcde"}
    assert docs["b"]["slow_fault"] == 10.0 and docs["b"]["look"] == 1
    first = rank_devices(docs, "p1", None, "cpu", 0.4)
    assert {r["host"] for r in first if r["flagged"]} == {"b", "c"}
    again_docs = {h: preflight_node(h, gpu=False, budget_s=0.2, look=2) for h in "abcde"}
    assert "slow_fault" not in again_docs["b"] and again_docs["c"]["slow_fault"] == 10.0
    again = rank_devices(again_docs, "p1-again", None, "cpu", 0.4)
    confirm(first, again)
    res = PreflightResult("p1", "cpu", first, again=again)
    assert res.slow_hosts == ["c"] and {r["host"] for r in res.cleared} == {"b"}
    assert len(res.recorded) == len(first) + len(again) == 20
    text = res.summary()
    assert "slow: c cpu " in text and "at the second look" in text  # either figure may be the one under it
    assert "cleared by a second look: b cpu " in text
    # a device the second look has no figure of (its host wrote nothing) is not cleared by that
    first2 = rank_devices(docs, "p2", None, "cpu", 0.9)
    confirm(first2, [r for r in again if r["host"] == "b"])
    assert {r["host"] for r in first2 if r["flagged"]} == {"c"}


def test_the_second_look_on_this_machine_is_a_fresh_process(monkeypatch, tmp_path: Path) -> None:
    # what a multi-GPU node's second look runs: python -m harness.runner.preflight --look 2, its own process
    from harness.spec.inventory import load_inventory

    monkeypatch.setenv("SBENCH_FAULT", "slow@stage=preflight,look=2:3")
    part = load_inventory(None).partition(None)
    host = pf.local_host(part, None)
    docs = pf._look_again_local(part, host, 0.2)  # noqa: SLF001 - the second look's own path
    assert docs[host]["look"] == 2 and docs[host]["slow_fault"] == 3.0 and docs[host]["devices"]
    with pytest.raises(FaultSpecError, match="look= names the preflight's first or second look"):
        parse_faults("slow@stage=preflight,look=3:2")
    with pytest.raises(FaultSpecError, match="look= names"):
        parse_faults("sleep@step=1,look=1:2")
