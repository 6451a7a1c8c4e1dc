"""Vision-language fine-tuning: the tiny LLaVA-NeXT model, the vision datasets, and real runs of both trainers
on this machine's CPU, their measurements recomputed here from the raw files and the dataset."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

VERSION = "3.2.2"
_LOAD_4X = """
import json, sys
from PIL import Image
from transformers import AutoModelForVision2Seq, AutoProcessor
m, info = AutoModelForVision2Seq.from_pretrained(sys.argv[1], output_loading_info=True)
p = AutoProcessor.from_pretrained(sys.argv[1])
msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "Describe"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A picture"}]}]
text = p.apply_chat_template(msgs, tokenize=False)
b = p(text=[text], images=[[Image.new("RGB", (384, 384), (9, 99, 199))] * 2], return_tensors="pt")
print(json.dumps({"missing": list(info["missing_keys"]), "unexpected": list(info["unexpected_keys"]),
                  "cls": type(m).__name__, "text": text, "ids": b["input_ids"][0].tolist(),
                  "loss": float(m(**b, labels=b["input_ids"]).loss.detach())}))
"""


def _load_5x(path: Path) -> dict:
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    m, info = AutoModelForImageTextToText.from_pretrained(str(path), output_loading_info=True)
    p = AutoProcessor.from_pretrained(str(path))
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "Describe"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "A picture"}]}]
    text = p.apply_chat_template(msgs, tokenize=False)
    b = p(text=[text], images=[[Image.new("RGB", (384, 384), (9, 99, 199))] * 2], return_tensors="pt")
    return {"missing": list(info["missing_keys"]), "unexpected": list(info["unexpected_keys"]),
            "cls": type(m).__name__, "text": text, "ids": b["input_ids"][0].tolist(),
            "loss": float(m(**b, labels=b["input_ids"]).loss.detach())}


def test_tiny_vision_model_loads_under_transformers_5_and_4(tiny_vision, cli, tmp_path) -> None:
    from harness.data.tinymodel import VISION_IMAGE_SIZE, VISION_PATCH
    from harness.spec.modelconfig import is_vision_config, model_config

    cfg = model_config(str(tiny_vision))
    assert cfg is not None and is_vision_config(cfg) and cfg["architectures"] == ["LlavaNextForConditionalGeneration"]
    five = _load_5x(tiny_vision)
    assert five["missing"] == [] and five["unexpected"] == [] and five["cls"] == "LlavaNextForConditionalGeneration"
    image_id = cfg["image_token_index"]
    # A 384x384 image on 32-pixel tiles of 8-pixel patches: anyres picks 2x2 tiles (64x64), so the model sees
    # the base tile's 4x4 features, then the 8x8 grid of the tiles with one newline feature per row.
    side = VISION_IMAGE_SIZE // VISION_PATCH
    per_image = side * side + (2 * side) * (2 * side + 1)
    assert five["ids"].count(image_id) == 2 * per_image
    assert five["loss"] > 0
    from harness.data.trainerenv import build
    from harness.spec.envs import envs_root

    env, _ = build(VERSION, envs_root(None), extras=("fms-accel",))
    out = subprocess.run([str(env.python), "-c", _LOAD_4X, str(tiny_vision)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    four = json.loads(out.stdout.strip().splitlines()[-1])
    assert four["missing"] == [] and four["unexpected"] == [] and four["cls"] == "LlavaNextForConditionalGeneration"
    # Same text, same tokens, same weights: the same loss under both majors.
    assert four["text"] == five["text"] and four["ids"] == five["ids"]
    assert four["loss"] == pytest.approx(five["loss"], rel=1e-4)
    res = cli("model", "tiny", "--vision", "-o", tmp_path / "cli")
    assert res.exit_code == 0 and "llava_next" in res.output


# -- real runs ----------------------------------------------------------------------------------------------
VISION_ID = "vision-384x384-16384plus-entries-4096"
ENTRIES = 4


@pytest.fixture(scope="module")
def vision_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data dir whose vision dataset holds 4 generated entries (12 images each) and no sidecar, so the
    runner uses the file as it is."""
    import shutil

    from harness.data.datagen import generate_dataset

    src = tmp_path_factory.mktemp("vgen") / f"{VISION_ID}.parquet"
    generate_dataset(VISION_ID, src, entries=ENTRIES)
    d = tmp_path_factory.mktemp("vdata")
    shutil.copy(src, d / f"{VISION_ID}.parquet")
    return d


@pytest.fixture(scope="module")
def vision_runs(tmp_path_factory, tiny_vision, vision_data_dir, cli_module):
    """LoRA and full fine-tuning of the tiny vision model, one process, through both trainers, one epoch of
    the 4-entry dataset each, through the local executor; then one collect."""
    from .kit import write_yaml

    cli = cli_module
    root = tmp_path_factory.mktemp("vision")
    env = {"root": root, "workdir": root / "runs", "db": root / "r.duckdb", "data": vision_data_dir}
    common = {"model_name": "tiny-vision", "model_max_length": 512, "dataset_id": VISION_ID, "batch_size": 2,
              "gradient_accumulation_steps": 1, "fms_hf_tuning_version": VERSION, "number_gpus": 1}
    for name, exp in (("vlora", "finetune_lora_benchmark-v1.0.0"), ("vfull", "finetune_full_benchmark-v1.0.0")):
        path = write_yaml(root / f"{name}.yaml", {
            "campaign": name, "experiment": exp, "entity": common,
            "grid": {"trainer": ["sbench", "fms-hf-tuning"]}, "model_map": {"tiny-vision": str(tiny_vision)},
            "data_dir": str(vision_data_dir), "runner": {"sample_interval_s": 0.05}})
        res = cli("submit", path, "--executor", "local", "--wait", "--workdir", env["workdir"], "--db", env["db"])
        assert res.exit_code == 0, res.output
    res = cli("collect", "--workdir", env["workdir"], "--db", env["db"])
    assert res.exit_code == 0, res.output
    return env


@pytest.mark.train
@pytest.mark.slow(60)
def test_vision_points_train_through_both_trainers_and_are_measured(vision_runs, tiny_vision) -> None:
    from harness.contract.paths import JobPaths
    from harness.data.vision import (
        count_entry,
        entry_images,
        entry_text,
        image_token_id,
        load_processor,
        open_vision_dataset,
    )

    from .kit import sql_rows

    rows = sql_rows(vision_runs["db"], "SELECT m.*, r.job_dir, r.outcome, r.reason FROM measurements m JOIN runs r "
                                       "USING (run_id) ORDER BY m.campaign, m.trainer")
    assert len(rows) == 4, rows
    assert all(r["outcome"] == "ok" and r["is_valid"] for r in rows), [(r["run_id"], r["reason"]) for r in rows]
    assert sorted({r["trainer"] for r in rows}) == ["fms-hf-tuning", "sbench"]
    # Independent recomputation: each entry's tokens and image tokens through the processor, from the file.
    proc = load_processor(str(tiny_vision))
    image_id = image_token_id(proc)
    per_entry = [count_entry(proc, entry_text(proc, row), entry_images(row), image_id)
                 for row in open_vision_dataset(vision_runs["data"] / f"{VISION_ID}.parquet")]
    assert len(per_entry) == ENTRIES
    total, images = sum(n for n, _ in per_entry), sum(i for _, i in per_entry)
    assert images > 0 and total > images
    cfg = json.loads((tiny_vision / "config.json").read_text())
    r = 4

    def qv(c: dict) -> int:
        head = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
        kv = c.get("num_key_value_heads") or c["num_attention_heads"]
        per_layer = r * (c["hidden_size"] + c["num_attention_heads"] * head) + r * (c["hidden_size"] + kv * head)
        return c["num_hidden_layers"] * per_layer

    lora = {"sbench": qv(cfg["text_config"]), "fms-hf-tuning": qv(cfg["text_config"]) + qv(cfg["vision_config"])}
    for m in rows:
        paths = JobPaths(m["job_dir"])
        r0 = json.loads(paths.rank_result(0).read_text())
        met = r0["metrics"]
        assert r0["meter"] == {"mismatches": 0, "unconsumed_batches": 0}, m["trainer"]
        assert met["train_samples"] == ENTRIES and met["dataset_tokens"] == total, m["trainer"]
        assert met["dataset_image_tokens"] == images, m["trainer"]
        assert m["dataset_tokens"] == total and m["dataset_image_tokens"] == images
        runtime = r0["train_end_wall"] - r0["train_start_wall"]
        assert m["dataset_tokens_per_second"] == pytest.approx(total / runtime, rel=1e-3)
        assert r0["dataset_token_counts"]["image_tokens"] == images
        assert "--dataset_image_field images" in " ".join(r0["argv"])
        assert r0["model"]["class"] == "LlavaNextForConditionalGeneration"
        if m["experiment"].startswith("finetune_lora"):
            # r (4) x (in + out) per targeted projection: q_proj, v_proj of each language-model layer; with
            # fms-hf-tuning also the vision tower's (the seed's --target_modules apply wherever the name occurs)
            assert r0["model"]["trainable_parameters"] == lora[m["trainer"]], m["trainer"]
        else:
            assert r0["model"]["trainable_parameters"] == r0["model"]["parameters"]
        if m["trainer"] == "fms-hf-tuning":
            assert sorted(r0["entries_consumed"]) == list(range(ENTRIES))
        else:  # submit prepared the counts: the job read them from the cache
            assert r0["dataset_token_counts"]["cache"] == "hit"


def test_prepare_counts_a_vision_dataset_once(cli, tmp_path, tiny_vision, vision_data_dir) -> None:
    from .kit import write_yaml

    sweep = write_yaml(tmp_path / "p.yaml", {
        "campaign": "p", "experiment": "finetune_lora_benchmark-v1.0.0",
        "entity": {"model_name": "tiny-vision", "model_max_length": 512, "dataset_id": VISION_ID, "batch_size": 1,
                   "number_gpus": 1}, "model_map": {"tiny-vision": str(tiny_vision)},
        "data_dir": str(vision_data_dir)})
    first = cli("prepare", sweep, "--json")
    assert first.exit_code == 0, first.output
    (item,) = [i for i in json.loads(first.stdout)["items"] if i["kind"] == "training_data"]
    assert item["rows"] == ENTRIES and 0 < item["image_tokens"] < item["tokens"]
    again = cli("prepare", sweep, "--json")
    (item2,) = [i for i in json.loads(again.stdout)["items"] if i["kind"] == "training_data"]
    assert item2["status"] == "ready" and item2["token_counts_cache"] == "hit" and item2["tokens"] == item["tokens"]
    # The entry holds each entry's images exactly as the dataset file does and its text rendered by the
    # processor's chat template, recomputed here from the Parquet file.
    import pyarrow as pa
    import pyarrow.parquet as pq
    from transformers import AutoProcessor

    from harness.data.vision import entry_text

    entry = Path(item["path"])
    with pa.memory_map(str(entry / "data.arrow")) as src:
        table = pa.ipc.open_stream(src).read_all()
    raw = pq.read_table(vision_data_dir / f"{VISION_ID}.parquet")
    assert table.column_names == ["images", "sbench_text"] and table.num_rows == ENTRIES
    assert table.column("images").to_pylist() == raw.column("images").to_pylist()
    proc = AutoProcessor.from_pretrained(str(tiny_vision))
    assert table.column("sbench_text").to_pylist() == [entry_text(proc, r) for r in raw.to_pylist()]
    meta = json.loads((entry / "meta.json").read_text())
    assert meta["tokens"] == item["tokens"] and meta["image_tokens"] == item["image_tokens"]
    # A damaged entry is rebuilt, never trained on.
    (entry / "data.arrow").chmod(0o644)
    with (entry / "data.arrow").open("r+b") as f:
        f.truncate(100)
    third = cli("prepare", sweep, "--json")
    assert third.exit_code == 0, third.output
    (item3,) = [i for i in json.loads(third.stdout)["items"] if i["kind"] == "training_data"]
    assert item3["status"] == "rebuilt" and item3["tokens"] == item["tokens"], item3


def test_plan_memory_counts_the_vision_tower_projector_and_language_model(cli, tmp_path, tiny_vision) -> None:
    from harness.data.tinymodel import describe_model

    from .kit import write_yaml

    sweep = write_yaml(tmp_path / "m.yaml", {
        "campaign": "m", "experiment": "finetune_full_benchmark-v1.0.0",
        "entity": {"model_max_length": 512, "dataset_id": VISION_ID, "batch_size": 1, "number_gpus": 1},
        "grid": {"model_name": ["tiny-vision", "granite-vision-3.2-2b"]},
        "model_map": {"tiny-vision": str(tiny_vision)}})
    res = cli("plan", sweep, "--memory", "--json")
    assert res.exit_code == 0, res.output
    by = {p["entity"]["model_name"]: p for p in json.loads(res.stdout)}
    tiny = by["tiny-vision"]["memory"]
    # every parameter of the instantiated model, counted from its weights file
    assert tiny["status"] == "ok" and tiny["parameters"] == describe_model(tiny_vision)["params"]
    assert tiny["trainable"] == tiny["parameters"] and {"vision_tower", "projector"} <= set(tiny["groups"])
    # the entries are 16384+ tokens, never truncated to model_max_length 512: the activations say so
    assert any("16,384 tokens" in n for n in tiny["notes"])
    granite = by["granite-vision-3.2-2b"]
    assert granite["valid"] and granite["predicted_oom"] is None
    assert "text_config and vision_config are not known here" in granite["memory"]["reason"]


def test_generate_counts_a_vision_dataset_with_the_models_processor(cli, tmp_path, tiny_vision) -> None:
    from harness.data.vision import (
        count_entry,
        entry_images,
        entry_text,
        image_token_id,
        load_processor,
        open_vision_dataset,
    )

    out = tmp_path / f"{VISION_ID}.parquet"
    res = cli("dataset", "generate", VISION_ID, "-o", out, "--entries", 2, "--tokenizer", tiny_vision, "--json")
    assert res.exit_code == 0, res.output
    g = json.loads(res.stdout)["length_guarantee"]
    assert g["method"] == "processor" and g["verified"] is True and g["min_tokens_seen"] >= 16384
    proc = load_processor(str(tiny_vision))
    image_id = image_token_id(proc)
    rows = list(open_vision_dataset(out))
    recount = [count_entry(proc, entry_text(proc, row), entry_images(row), image_id) for row in rows]
    assert min(n for n, _ in recount) == g["min_tokens_seen"] >= 16384
    assert sum(i for _, i in recount) == g["image_tokens"]
    assert all(len(row["images"]) == g["copies_per_entry"] for row in rows)
    # a text tokenizer cannot count images: an input error naming the option
    text_only = tmp_path / "lm"
    from harness.data.tinymodel import make_tiny_model

    make_tiny_model(text_only)
    bad = cli("dataset", "generate", VISION_ID, "-o", tmp_path / "b.parquet", "--entries", 1, "--tokenizer", text_only)
    assert bad.exit_code == 2 and "--tokenizer" in bad.output and "Traceback" not in bad.output


@pytest.mark.train
@pytest.mark.slow(40)
def test_vision_lora_over_two_processes_through_both_trainers(cli, tmp_path, tiny_vision, vision_data_dir) -> None:
    """Two CPU worker processes (DDP): every entry's tokens are counted once per time a rank consumed it."""
    from harness.contract.paths import JobPaths
    from harness.data.vision import (
        count_entry,
        entry_images,
        entry_text,
        image_token_id,
        load_processor,
        open_vision_dataset,
    )

    from .kit import sql_rows, write_yaml

    db, workdir = tmp_path / "r.duckdb", tmp_path / "runs"
    sweep = write_yaml(tmp_path / "v2.yaml", {
        "campaign": "v2", "experiment": "finetune_lora_benchmark-v1.0.0",
        "entity": {"model_name": "tiny-vision", "model_max_length": 512, "dataset_id": VISION_ID, "batch_size": 2,
                   "gradient_accumulation_steps": 1, "fms_hf_tuning_version": VERSION, "number_gpus": 2,
                   "distributed_backend": "DDP"},
        "grid": {"trainer": ["sbench", "fms-hf-tuning"]}, "model_map": {"tiny-vision": str(tiny_vision)},
        "data_dir": str(vision_data_dir), "runner": {"sample_interval_s": 0.05}})
    res = cli("submit", sweep, "--executor", "local", "--wait", "--workdir", workdir, "--db", db)
    assert res.exit_code == 0, res.output
    assert cli("collect", "--workdir", workdir, "--db", db).exit_code == 0
    proc = load_processor(str(tiny_vision))
    image_id = image_token_id(proc)
    per_entry = [count_entry(proc, entry_text(proc, row), entry_images(row), image_id)
                 for row in open_vision_dataset(vision_data_dir / f"{VISION_ID}.parquet")]
    rows = sql_rows(db, "SELECT m.*, r.job_dir, r.outcome, r.reason FROM measurements m JOIN runs r USING (run_id)")
    assert len(rows) == 2 and all(r["outcome"] == "ok" for r in rows), [(r["trainer"], r["reason"]) for r in rows]
    for m in rows:
        paths = JobPaths(m["job_dir"])
        ranks = [json.loads(paths.rank_result(r).read_text()) for r in range(2)]
        assert ranks[0]["distributed"]["distributed_type"] == "MULTI_CPU"
        if m["trainer"] == "fms-hf-tuning":
            consumed = [i for r in ranks for i in r["entries_consumed"]]
            assert len(consumed) == ENTRIES and min(consumed) >= 0
        else:  # the distributed sampler splits the entries: each once
            consumed = list(range(ENTRIES))
        total = sum(per_entry[i][0] for i in consumed)
        images = sum(per_entry[i][1] for i in consumed)
        assert sum(r["metrics"]["rank_dataset_tokens"] for r in ranks) == total == m["dataset_tokens"], m["trainer"]
        assert sum(r["metrics"]["rank_dataset_image_tokens"] for r in ranks) == images == m["dataset_image_tokens"]


@pytest.mark.slurm
@pytest.mark.train
@pytest.mark.slow(25)
def test_vision_lora_across_two_slurm_nodes(cli, tmp_path, tiny_vision, vision_data_dir, slurm_cluster) -> None:
    """One process on each test-cluster node (DDP over gloo), the sbench trainer: every entry once, its text
    and image tokens counted."""
    from harness.contract.paths import JobPaths

    from .kit import TEST_INVENTORY, sql_rows, write_yaml

    db, workdir = tmp_path / "r.duckdb", tmp_path / "runs"
    sweep = write_yaml(tmp_path / "v2n.yaml", {
        "campaign": "v2n", "experiment": "finetune_lora_benchmark-v1.0.0", "partition": "cpu",
        "entity": {"model_name": "tiny-vision", "model_max_length": 512, "dataset_id": VISION_ID, "batch_size": 2,
                   "gradient_accumulation_steps": 1, "number_gpus": 2, "number_nodes": 2,
                   "distributed_backend": "DDP"},
        "model_map": {"tiny-vision": str(tiny_vision)}, "data_dir": str(vision_data_dir),
        "runner": {"sample_interval_s": 0.5}})
    res = cli("submit", sweep, "-i", TEST_INVENTORY, "--executor", "slurm", "--wait", "--workdir", workdir,
              "--db", db)
    assert res.exit_code == 0, res.output
    assert cli("collect", "--workdir", workdir, "--db", db).exit_code == 0
    (m,) = sql_rows(db, "SELECT m.*, r.job_dir, r.outcome, r.reason, r.node_list FROM measurements m JOIN runs r "
                        "USING (run_id)")
    assert m["outcome"] == "ok", m["reason"]
    assert m["node_list"] == "node[1-2]" and m["world_size"] == 2
    ranks = [json.loads(JobPaths(m["job_dir"]).rank_result(r).read_text()) for r in range(2)]
    assert [r["host"] for r in ranks] == ["node1", "node2"]
    counted = ranks[0]["dataset_token_counts"]
    assert m["dataset_tokens"] == counted["total"] and m["dataset_image_tokens"] == counted["image_tokens"] > 0
    assert sum(r["metrics"]["rank_dataset_tokens"] for r in ranks) == counted["total"]


def test_the_generated_entries_collate_as_trls_vision_collator_makes_them(tiny_vision, vision_data_dir) -> None:
    """trl's own ``DataCollatorForVisionLanguageModeling`` on the dataset's messages and images gives the
    images and tokens sbench's collator gives (and fms-hf-tuning's, which it follows), but for the one BOS
    token the processor adds to the rendered text (trl leaves special tokens to the chat template)."""
    import pyarrow.parquet as pq
    import torch
    from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

    from harness.data.vision import _clean, entry_images, entry_text, load_processor
    from harness.data.visionprep import VISION_TEXT
    from harness.runner.measure import Meter
    from harness.runner.train import VisionCollator

    proc = load_processor(str(tiny_vision))
    rows = pq.read_table(vision_data_dir / f"{VISION_ID}.parquet").to_pylist()[:2]
    ours = VisionCollator(proc, "images", Meter())([{"images": r["images"], VISION_TEXT: entry_text(proc, r)}
                                                   for r in rows])
    trl = DataCollatorForVisionLanguageModeling(processor=proc)(
        [{"images": entry_images(r), "messages": _clean(r["messages"])} for r in rows])
    assert torch.equal(ours["pixel_values"], trl["pixel_values"]) and torch.equal(ours["image_sizes"],
                                                                                   trl["image_sizes"])
    bos = proc.tokenizer.bos_token_id
    for i in range(len(rows)):
        mine = ours["input_ids"][i][ours["attention_mask"][i] == 1].tolist()
        theirs = trl["input_ids"][i][trl["attention_mask"][i] == 1].tolist()
        assert mine[0] == bos and mine[1:] == theirs
        assert theirs.count(proc.tokenizer.convert_tokens_to_ids(proc.image_token)) > 0
