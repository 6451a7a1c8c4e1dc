"""References in a sweep: their checks in plan, which entry applies, and the check verdicts."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.contract.errors import SweepError
from harness.spec.catalog import get_experiment
from harness.spec.references import Reference, check_rows, pick
from harness.spec.sweep import load_sweep

from .kit import write_yaml

EXP = "finetune_lora_benchmark-v1.0.0"


def sweep_with(tmp_path: Path, refs) -> Path:
    return write_yaml(tmp_path / "s.yaml", {"campaign": "c", "experiment": EXP,
                                            "entity": {"model_name": "tiny", "number_gpus": 1},
                                            "references": refs})


def test_references_parse_with_selectors_in_file_order(tmp_path: Path) -> None:
    sw = load_sweep(sweep_with(tmp_path, {
        "train_tokens_per_second": {"value": 5200, "lower": 0.1},
        "gpu_memory_utilization_peak": [{"value": 62, "upper": 0.05, "model_name": "llama3-8b", "number_gpus": 8},
                                        {"value": 40, "upper": 0.25, "unit": "%"}]}))
    assert [r.metric for r in sw.references] == ["train_tokens_per_second", "gpu_memory_utilization_peak",
                                                 "gpu_memory_utilization_peak"]
    first = sw.references[0]
    assert first.low == pytest.approx(4680) and first.high is None
    assert sw.references[1].where == {"model_name": "llama3-8b", "number_gpus": 8}
    assert Reference.from_dict(sw.references[1].to_dict()) == sw.references[1]


@pytest.mark.parametrize("refs, message", [
    ({"train_tokens_per_secnd": {"value": 1, "lower": 0.1}}, "did you mean 'train_tokens_per_second'"),
    ({"mfu": {"value": 0.4}}, "needs lower: and/or upper:"),
    ({"mfu": {"lower": 0.1}}, "references.mfu.value is required"),
    ({"mfu": {"value": 0.4, "lower": -0.1}}, "references.mfu.lower must be a number >= 0"),
    ({"mfu": {"value": 0.4, "lower": 0.1, "number_gpu": 8}}, "did you mean 'number_gpus'"),
    ({"mfu": [{"value": 0.4, "lower": 0.1, "number_gpus": "eight"}]}, "references.mfu[0].number_gpus"),
    ({"mfu": "fast"}, "references.mfu must be a mapping"),
])
def test_bad_references_name_the_key_and_the_fix(tmp_path: Path, refs, message: str) -> None:
    with pytest.raises(SweepError, match=message.replace("[", r"\[").replace("(", r"\(")):
        load_sweep(sweep_with(tmp_path, refs))


def test_the_most_specific_entry_applies_then_the_first() -> None:
    refs = [Reference("mfu", 0.3, 0.1, order=0), Reference("mfu", 0.5, 0.1, where={"number_gpus": 8}, order=1),
            Reference("mfu", 0.6, 0.1, where={"number_gpus": 8, "model_name": "m"}, order=2),
            Reference("mfu", 0.7, 0.1, where={"model_name": "m", "number_gpus": 8.0}, order=3)]
    assert pick(refs, "mfu", {"number_gpus": 4, "model_name": "m"}).value == 0.3
    assert pick(refs, "mfu", {"number_gpus": 8, "model_name": "x"}).value == 0.5
    assert pick(refs, "mfu", {"number_gpus": 8, "model_name": "m"}).value == 0.6
    assert pick(refs, "train_runtime", {"number_gpus": 8}) is None


def test_check_verdicts_pass_fail_and_every_kind_of_missing() -> None:
    refs = [Reference("train_tokens_per_second", 1000.0, lower=0.1, upper=0.5)]
    pts = [{"point_id": "a", "repeat": 0, "entity": {}, "run_id": "r1", "outcome": "ok",
            "values": {"train_tokens_per_second": 950.0}},
           {"point_id": "b", "repeat": 0, "entity": {}, "run_id": "r2", "outcome": "ok",
            "values": {"train_tokens_per_second": 899.0}},
           {"point_id": "c", "repeat": 0, "entity": {}, "run_id": "r3", "outcome": "ok",
            "values": {"train_tokens_per_second": 1501.0}},
           {"point_id": "d", "repeat": 0, "entity": {}, "run_id": None, "outcome": None, "values": {}},
           {"point_id": "e", "repeat": 0, "entity": {}, "run_id": "r5", "outcome": "failed", "values": {}},
           {"point_id": "f", "repeat": 0, "entity": {}, "run_id": "r6", "outcome": None, "values": {}},
           {"point_id": "g", "repeat": 0, "entity": {}, "run_id": "r7", "outcome": "ok",
            "values": {"train_tokens_per_second": None}}]
    rows = {r["point_id"]: r for r in check_rows("c", refs, pts)}
    assert rows["a"]["status"] == "pass" and rows["a"]["deviation"] == pytest.approx(-0.05)
    assert rows["b"]["status"] == "fail" and rows["b"]["reason"] == "899 < 900 (1000 - 10%)"
    assert rows["c"]["status"] == "fail" and rows["c"]["reason"] == "1501 > 1500 (1000 + 50%)"
    assert [rows[k]["reason"] for k in "defg"] == ["not run yet", "the run is failed", "the run is not over",
                                                   "the run measured no train_tokens_per_second"]
    assert {rows[k]["status"] for k in "defg"} == {"missing"}


def test_plan_json_shows_nothing_of_references_but_keeps_working(tmp_path: Path) -> None:
    sw = load_sweep(sweep_with(tmp_path, {"mfu": {"value": 0.4, "lower": 0.2}}))
    assert sw.references[0].where == {} and get_experiment(EXP).field("model_name") is not None
