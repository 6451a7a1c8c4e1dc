"""Slow paths found before a job runs: a generated dataset shorter than its name promises for the point's model,
an fms-hf-tuning vision point's start-up, and debug logging inside the timed steps."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from harness.spec.rules import FMS_VISION_STARTUP_S_PER_ENTRY, fms_vision_startup

from .kit import write_yaml

VISION_ID = "vision-384x384-16384plus-entries-4096"


@pytest.mark.slow(15)
def test_plan_says_when_a_vision_dataset_falls_short_of_its_name_for_the_points_model(cli, tmp_path: Path,
                                                                                      tiny_vision: Path) -> None:
    from harness.data.datagen import generate_dataset, read_meta
    from harness.data.lengths import probe_counts

    data = tmp_path / "data"
    path = data / f"{VISION_ID}.parquet"
    generate_dataset(VISION_ID, path, entries=4)  # no --tokenizer: the image copies follow an estimate
    assert read_meta(path)["length_guarantee"]["verified"] is False
    counts = probe_counts(path, str(tiny_vision), True, "output")
    assert counts and max(counts) < 16384  # the tiny model's processor spends far fewer tokens an image
    doc = {"campaign": "short", "experiment": "finetune_lora_benchmark-v1.0.0",
           "entity": {"model_name": "tiny-vision", "model_max_length": 64, "dataset_id": VISION_ID,
                      "number_gpus": 1, "batch_size": 1, "max_steps": 2},
           "model_map": {"tiny-vision": str(tiny_vision)}, "data_dir": str(data)}
    sw = write_yaml(tmp_path / "s.yaml", doc)
    res = cli("plan", sw)
    assert res.exit_code == 0, res.output
    said = f"{VISION_ID} promises entries of at least 16384 tokens, but with tiny-vision's processor its first 4 " \
           f"have {min(counts)} to {max(counts)}"
    assert said in res.output and "image-copies-estimate, not verified" in res.output
    assert f"--tokenizer {tiny_vision}" in res.output
    # generated for this very model, the promise is kept and nothing is said
    generate_dataset(VISION_ID, path, entries=2, tokenizer=str(tiny_vision))
    assert read_meta(path)["length_guarantee"]["verified"] is True
    again = cli("plan", sw)
    assert again.exit_code == 0 and "promises entries" not in again.output


def test_an_fms_hf_tuning_vision_point_is_told_its_start_up_cost() -> None:
    (text,) = fms_vision_startup({"trainer": "fms-hf-tuning", "dataset_id": VISION_ID})
    minutes = 4096 * FMS_VISION_STARTUP_S_PER_ENTRY / 60
    assert f"about {minutes:.0f} minute(s) of start-up per job" in text and "trainer: sbench" in text
    assert round(minutes) == 11  # 551 s + 95 s, as measured
    assert fms_vision_startup({"trainer": "sbench", "dataset_id": VISION_ID}) == []
    assert fms_vision_startup({"trainer": "fms-hf-tuning", "dataset_id": "news-chars-512-entries-4096"}) == []


def test_logging_inside_the_timed_steps_is_at_most_info_unless_asked() -> None:
    import transformers

    from harness.runner.measure import timed_log_level

    decoder = logging.getLogger("sbench-test.image-decoder")
    root, verbosity = logging.getLogger().level, transformers.utils.logging.get_verbosity()
    try:
        decoder.setLevel(logging.DEBUG)
        logging.getLogger().setLevel(logging.DEBUG)  # what --log_level debug leaves behind
        transformers.utils.logging.set_verbosity_debug()
        note = timed_log_level("info")
        assert note is not None and "runner.train_log_level: debug keeps it" in note
        assert decoder.level == logging.INFO and logging.getLogger().level == logging.INFO
        assert transformers.utils.logging.get_verbosity() == logging.INFO
        assert not decoder.isEnabledFor(logging.DEBUG)
        assert timed_log_level("info") is None  # nothing left to lower: no note
        decoder.setLevel(logging.DEBUG)
        assert timed_log_level("debug") is None and decoder.level == logging.DEBUG  # asked for: kept
    finally:
        decoder.setLevel(logging.NOTSET)
        logging.getLogger().setLevel(root)
        transformers.utils.logging.set_verbosity(verbosity)


def test_train_log_level_is_a_runner_setting(cli, tmp_path: Path) -> None:
    base = {"campaign": "lv", "experiment": "finetune_full_benchmark-v1.0.0",
            "entity": {"model_name": "smollm2-135m", "model_max_length": 64, "number_gpus": 1, "batch_size": 2}}
    ok = write_yaml(tmp_path / "ok.yaml", {**base, "runner": {"train_log_level": "debug"}})
    assert cli("plan", ok).exit_code == 0
    bad = write_yaml(tmp_path / "bad.yaml", {**base, "runner": {"train_log_level": "loud"}})
    res = cli("plan", bad)
    assert res.exit_code == 2 and "runner.train_log_level" in res.output and "debug, info, warning, error" in res.output
