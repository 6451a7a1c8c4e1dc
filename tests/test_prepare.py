"""Campaign preparation: sbench prepare, the shared prepared-data cache, and jobs that find it (or not).

Every check reads real artifacts: the Arrow file a job memory-maps is compared with a fresh
encoding of the dataset, corruption is made by editing the bytes on disk, and concurrency by
running two real ``sbench prepare`` processes at once.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from harness.data.prepared import DATA_FILE, META_FILE, PREP_DIR, ensure_prepared
from harness.data.tokens import _Encoder, encode_for_training, load_tokenizer

from . import kit
from .kit import ROOT, SMALL_DATASET, command, sbench, sql_rows, write_yaml

TEMPLATE = "\\n### Response:"


def entries(root: Path) -> list[Path]:
    enc = root / PREP_DIR / "encoded"
    return sorted(p for p in enc.iterdir() if p.is_dir()) if enc.exists() else []


def prep(tok, data: Path, root: Path, **kw):
    args = {"text_field": "output", "max_seq_length": 128, "response_template": TEMPLATE, "root": root / PREP_DIR,
            "token_cache": root / ".token-counts"}
    args.update(kw)
    return ensure_prepared(tok, data, **args)


@pytest.fixture(scope="module")
def small(tmp_path_factory, small_data_dir) -> Path:
    """A private copy of the 64-entry dataset (each test module owns its caches)."""
    d = tmp_path_factory.mktemp("prep-data")
    shutil.copy(small_data_dir / f"{SMALL_DATASET}.jsonl", d / f"{SMALL_DATASET}.jsonl")
    return d / f"{SMALL_DATASET}.jsonl"


def sweep_doc(name: str, model: Path, data_dir: Path, **entity) -> dict:
    return kit.sweep(model, data_dir, campaign=name, entity={"model_max_length": 128, **entity},
                     runner={"sample_interval_s": 0.2})


# -- the cache entry --------------------------------------------------------------------------------------------
def test_entry_is_the_training_data_memory_mapped_and_read_only(tiny_model, small, tmp_path) -> None:
    p = prep(str(tiny_model), small, tmp_path)
    assert p.status == "built" and p.reason == "not prepared"
    ref = encode_for_training(str(tiny_model), small, max_seq_length=128, response_template=TEMPLATE)
    assert p.dataset.data.table.equals(ref.data.table)
    assert type(p.dataset.data).__name__ == "MemoryMappedTable"
    assert p.rows == 64 and p.tokens == sum(len(x) for x in ref["input_ids"])
    assert not os.stat(p.path).st_mode & 0o222 and not os.stat(p.path / DATA_FILE).st_mode & 0o222
    # The token-count cache was written by the build: counting is a hit, and agrees.
    from harness.data.tokens import dataset_token_counts

    counts = dataset_token_counts(str(tiny_model), small, max_seq_length=128, cache_dir=tmp_path / ".token-counts")
    assert counts.cache == "hit" and counts.counts == [len(x) for x in ref["input_ids"]]
    again = prep(str(tiny_model), small, tmp_path)
    assert again.status == "hit" and again.key == p.key and again.build_s is None


def test_key_changes_with_every_input_and_nothing_stale_is_reused(tiny_model, small, tmp_path) -> None:
    from harness.data.tinymodel import make_tiny_model

    other_tok = make_tiny_model(tmp_path / "other", seed=1)
    renamed = tmp_path / "renamed.jsonl"  # the same texts under another field
    renamed.write_text("".join(json.dumps({"text": json.loads(line)["output"]}) + "\n"
                               for line in small.read_text().splitlines()))
    edited = tmp_path / "edited.jsonl"  # one entry changed
    rows = small.read_text().splitlines()
    rows[3] = json.dumps({"output": json.loads(rows[3])["output"].replace("the", "a")})
    edited.write_text("\n".join(rows) + "\n")
    base = prep(str(tiny_model), small, tmp_path)
    variants = {
        "tokenizer": prep(str(other_tok), small, tmp_path),
        "max length": prep(str(tiny_model), small, tmp_path, max_seq_length=96),
        "dataset": prep(str(tiny_model), edited, tmp_path),
        "text field": prep(str(tiny_model), renamed, tmp_path, text_field="text"),
        "template": prep(str(tiny_model), small, tmp_path, response_template="\\n\\n### Response:"),
    }
    # Only the tokenizer differs from an existing entry: the reason says so (another library version?).
    assert "tokenizer fingerprint" in variants["tokenizer"].reason
    assert variants["max length"].reason == "not prepared"
    keys = {base.key} | {v.key for v in variants.values()}
    assert len(keys) == 6, "every changed input must give its own entry"
    for what, v in variants.items():
        assert v.status == "built", what
        tok = str(other_tok) if what == "tokenizer" else str(tiny_model)
        src = {"dataset": edited, "text field": renamed}.get(what, small)
        ref = encode_for_training(tok, src, text_field="text" if what == "text field" else "output",
                                  max_seq_length=96 if what == "max length" else 128,
                                  response_template="\\n\\n### Response:" if what == "template" else TEMPLATE)
        assert v.dataset.data.table.equals(ref.data.table), what
    assert len(entries(tmp_path)) == 6


@pytest.mark.parametrize("damage", ["truncate", "flip", "meta", "drop-data"])
def test_a_damaged_entry_is_detected_and_rebuilt_never_used(tiny_model, small, tmp_path, damage) -> None:
    p = prep(str(tiny_model), small, tmp_path)
    data, meta = p.path / DATA_FILE, p.path / META_FILE
    p.path.chmod(0o755)
    for f in (data, meta):
        f.chmod(0o644)
    raw = data.read_bytes()
    if damage == "truncate":
        data.write_bytes(raw[: len(raw) // 2])
    elif damage == "flip":  # same size, one byte different: only the checksum can tell
        mid = len(raw) // 2
        data.write_bytes(raw[:mid] + bytes([raw[mid] ^ 0x5A]) + raw[mid + 1:])
    elif damage == "meta":
        meta.write_text("{not json")
    else:
        data.unlink()
    dead = p.path.parent / f".tmp-{p.key}-otherhost-4242"  # what a builder killed mid-write leaves
    dead.mkdir()
    (dead / DATA_FILE).write_bytes(b"half")
    again = prep(str(tiny_model), small, tmp_path)
    assert again.status == "rebuilt" and again.key == p.key, again.summary()
    expected = {"truncate": "truncated", "flip": "corrupted", "meta": "unreadable", "drop-data": "missing"}[damage]
    assert expected in again.reason
    ref = encode_for_training(str(tiny_model), small, max_seq_length=128, response_template=TEMPLATE)
    assert again.dataset.data.table.equals(ref.data.table)
    assert (again.path / DATA_FILE).read_bytes() == raw
    leftovers = [p.name for p in (tmp_path / PREP_DIR / "encoded").iterdir() if p.name.startswith(".")]
    assert leftovers == []


# -- the prefix shortcut ----------------------------------------------------------------------------------------
def test_long_entries_encode_from_a_prefix_with_identical_results(tiny_model, tmp_path) -> None:
    from harness.data.datagen import generate_dataset

    path = tmp_path / "news-tokens-16384plus-entries-4096.jsonl"
    generate_dataset("news-tokens-16384plus-entries-4096", path, entries=12)
    texts = [json.loads(line)["output"] for line in path.read_text().splitlines()]
    tok = load_tokenizer(str(tiny_model))
    for max_len in (64, 700, 2048):
        fast, whole = _Encoder(tok, max_len), _Encoder(tok, max_len)
        whole.prefix_disabled = "test: whole texts"
        assert fast.lengths(texts) == whole.lengths(texts) == [max_len] * len(texts)
        assert fast.encode(texts) == whole.encode(texts)
        assert fast.shortened > 0 and fast.prefix_disabled is None and whole.shortened == 0


def test_a_prefix_that_encodes_differently_turns_the_shortcut_off(tiny_model) -> None:
    class Enc:
        def __init__(self, ids, overflow):
            self.ids, self.offsets, self.overflowing = ids, [(0, 0)] * len(ids), [[0] * overflow] if overflow else []

        def __len__(self):
            return len(self.ids)

    def call(batch):  # a tokenizer whose ids depend on where the text ends
        return [Enc([len(t) % 7] * 10, 500) for t in batch]

    enc = _Encoder(load_tokenizer(str(tiny_model)), 10)
    texts = ["word " * 20_000]
    out = enc._run(texts, call)
    assert enc.prefix_disabled and out[0].ids == call(texts)[0].ids
    assert enc._cut(texts[0]) == len(texts[0])  # and it stays off


# -- sbench prepare ----------------------------------------------------------------------------------------------
def test_prepare_is_idempotent(tiny_model, tmp_path) -> None:
    data = tmp_path / "data"
    doc = sweep_doc("prep-idem", tiny_model, data)
    del doc["entity"]["model_max_length"]
    sw = write_yaml(tmp_path / "s.yaml", {**doc, "grid": {"model_max_length": [64, 128]}})
    first = json.loads(sbench("prepare", sw, "--json").stdout)["items"]
    kinds = sorted((i["kind"], i["status"]) for i in first)
    assert kinds == [("dataset", "generated"), ("model", "ready"), ("training_data", "built"),
                     ("training_data", "built")], kinds
    made = {p.name: p.stat().st_mtime_ns for p in entries(data)}
    assert len(made) == 2
    second = json.loads(sbench("prepare", sw, "--json").stdout)["items"]
    assert {i["status"] for i in second} == {"ready"}
    assert {p.name: p.stat().st_mtime_ns for p in entries(data)} == made
    assert all(i["token_counts_cache"] == "hit" for i in second if i["kind"] == "training_data")


def test_two_concurrent_prepares_build_once_and_both_succeed(tiny_model, tmp_path) -> None:
    data = tmp_path / "data"
    sw = write_yaml(tmp_path / "s.yaml", sweep_doc("prep-race", tiny_model, data))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen(command("prepare", sw, "--json"), cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    items = [i for out, _ in outs for i in json.loads(out)["items"]]
    built = [i for i in items if i["kind"] == "training_data" and i["status"] == "built"]
    generated = [i for i in items if i["kind"] == "dataset" and i["status"] == "generated"]
    assert len(built) == 1 and len(generated) == 1, items
    (entry,) = entries(data)
    keys = {i["key"] for i in items if i["kind"] == "training_data"}
    assert keys == {entry.name}
    assert prep(str(tiny_model), data / f"{SMALL_DATASET}.jsonl", data).status == "hit"
    assert not [p for p in (data / PREP_DIR / "encoded").iterdir() if p.name.startswith(".")]


def test_model_problems_are_input_errors_that_name_the_fix(tiny_model, tmp_path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model, broken)
    for w in broken.glob("*.safetensors"):
        w.unlink()
    sw = write_yaml(tmp_path / "s.yaml", sweep_doc("prep-model", broken, tmp_path / "data"))
    res = sbench("prepare", sw, ok=None)
    assert res.returncode == 2 and "lacks weights" in res.stderr and "Traceback" not in res.stderr
    hub = write_yaml(tmp_path / "h.yaml", {**sweep_doc("prep-hub", tiny_model, tmp_path / "data"),
                                           "model_map": {"tiny": "sbench-test/not-cached-anywhere"}})
    res = sbench("prepare", hub, ok=None, env={"HF_HUB_CACHE": str(tmp_path / "hub")})
    assert res.returncode == 2, res.stderr
    assert "not in the shared model cache" in res.stderr and "sbench model fetch sbench-test/not-cached" in res.stderr
    res = sbench("model", "fetch", "sbench-test/not-cached-anywhere", "--cache", tmp_path / "hub", ok=None,
                 env={"HF_HUB_OFFLINE": "1"})
    assert res.returncode == 2 and "HF_HUB_OFFLINE=1" in res.stderr and "Traceback" not in res.stderr
    # An id that is in the cache is found there: a hub-layout snapshot of the tiny model.
    snap = tmp_path / "hub" / "models--sbench-test--tiny" / "snapshots" / ("0" * 40)
    shutil.copytree(tiny_model, snap)
    (snap.parent.parent / "refs").mkdir()
    (snap.parent.parent / "refs" / "main").write_text("0" * 40)
    cached = write_yaml(tmp_path / "c.yaml", {**sweep_doc("prep-cached", tiny_model, tmp_path / "data"),
                                              "model_map": {"tiny": "sbench-test/tiny"}})
    out = json.loads(sbench("prepare", cached, "--json", env={"HF_HUB_CACHE": str(tmp_path / "hub")}).stdout)
    model = next(i for i in out["items"] if i["kind"] == "model")
    assert model["status"] == "ready" and str(snap) in model["detail"]


# -- jobs ----------------------------------------------------------------------------------------------------------
@pytest.mark.train
@pytest.mark.slow(40)
def test_a_job_without_preparation_builds_it_notes_it_and_the_next_one_maps_it(tiny_model, tmp_path) -> None:
    data, runs, db = tmp_path / "data", tmp_path / "runs", tmp_path / "r.duckdb"
    sw = write_yaml(tmp_path / "s.yaml", sweep_doc("prep-job", tiny_model, data))
    common = ["--executor", "local", "--workdir", runs, "--db", db]
    sbench("submit", sw, "--no-prepare", "--wait", *common)
    sbench("collect", "--workdir", runs, "--db", db)
    (first,) = sql_rows(db, "SELECT * FROM runs WHERE campaign = 'prep-job'")
    assert first["outcome"] == "ok", first["reason"]
    stages = sql_rows(db, "SELECT rank, info FROM stages WHERE run_id = ? AND stage = 'dataset' ORDER BY rank NULLS "
                          "FIRST", [first["run_id"]])
    runner, rank0 = (json.loads(s["info"]) for s in stages)
    assert runner["status_before"] == "missing" and "sbench prepare" in runner["note"]
    assert rank0["prepared"]["status"] == "built" and "sbench prepare" in rank0["note"]
    # Start-up is attributed: the rank's launch stage (launcher, imports, rendezvous) precedes its data stages.
    (launch,) = sql_rows(db, "SELECT * FROM stages WHERE run_id = ? AND stage = 'launch'", [first["run_id"]])
    li = json.loads(launch["info"])
    assert launch["status"] == "ok" and li["imports_s"] > 0 and li["launcher_s"] >= 0 and li["rendezvous_s"] >= 0
    # its parts (launcher, interpreter, sbench's imports, the training libraries', the process group) add up to it
    parts = ("launcher_s", "interpreter_s", "runner_imports_s", "imports_s", "rendezvous_s")
    assert all(li[p] >= 0 for p in parts) and li["interpreter_s"] > 0 and li["runner_imports_s"] > 0, li
    assert sum(li[p] for p in parts) == pytest.approx(launch["duration_s"], abs=0.02), li
    assert launch["end_wall"] <= sql_rows(db, "SELECT min(start_wall) AS t FROM stages WHERE run_id = ? AND rank = 0 "
                                              "AND stage = 'dataset'", [first["run_id"]])[0]["t"]
    (ov,) = sql_rows(db, "SELECT * FROM run_overhead WHERE run_id = ?", [first["run_id"]])
    assert ov["prepared_in_job"] is True and ov["startup_s"] > 0 and 0 < ov["outside_train_fraction"] < 1
    status = sbench("status", "--campaign", "prep-job", "--workdir", runs, "--db", db).stdout
    assert "data prepared in the job" in status and "startup_s" in status
    # Damage the entry the job built: the next job (no prepare) detects it, rebuilds it and trains on good data.
    (entry,) = entries(data)
    entry.chmod(0o755)
    (entry / DATA_FILE).chmod(0o644)
    with open(entry / DATA_FILE, "r+b") as f:
        f.seek(200)
        f.write(b"\xff\xff\xff\xff")
    sbench("submit", sw, "--no-prepare", "--force", "--wait", *common)
    # And with preparation (the default), a third job only maps it.
    sbench("submit", sw, "--force", "--wait", *common)
    sbench("collect", "--workdir", runs, "--db", db)
    rows = sql_rows(db, """SELECT r.attempt, r.outcome, s.info, o.prepared_in_job FROM runs r
                           JOIN stages s USING (run_id) JOIN run_overhead o USING (run_id)
                           WHERE r.campaign = 'prep-job' AND s.stage = 'dataset' AND s.rank = 0 ORDER BY r.attempt""")
    got = [(r["attempt"], r["outcome"], json.loads(r["info"])["prepared"]["status"], r["prepared_in_job"])
           for r in rows]
    assert got == [(1, "ok", "built", True), (2, "ok", "rebuilt", True), (3, "ok", "hit", False)], got
    assert "corrupted" in json.loads(rows[1]["info"])["prepared"]["reason"]
    ref = encode_for_training(str(tiny_model), data / f"{SMALL_DATASET}.jsonl", max_seq_length=128,
                              response_template=TEMPLATE)
    assert prep(str(tiny_model), data / f"{SMALL_DATASET}.jsonl", data).dataset.data.table.equals(ref.data.table)


def test_inventory_shared_dirs_reach_the_jobs(tiny_model, tmp_path, cli) -> None:
    """defaults.data_dir / models_dir (relative to the inventory) become the jobs' data dir and HF_HUB_CACHE."""
    inv = write_yaml(tmp_path / "inv.yaml", {
        "cluster": "c", "defaults": {"data_dir": "shared/data", "models_dir": "shared/models"},
        "partitions": {"cpu": {"gpu_model": "cpu", "gpus_per_node": 2, "cpus_per_node": 4, "memory_gb": 8,
                               "hosts": {"n1": {}}}}})
    doc = sweep_doc("prep-inv", tiny_model, tmp_path)
    del doc["data_dir"]
    sw = write_yaml(tmp_path / "s.yaml", doc)
    res = cli("render", sw, "-i", inv, "-o", tmp_path / "out")
    assert res.exit_code == 0, res.output
    (spec_file,) = (tmp_path / "out").glob("*/spec.json")
    js = json.loads(spec_file.read_text())["jobspec"]
    assert js["data_dir"] == str(tmp_path / "shared" / "data")
    assert js["dataset_path"] == str(tmp_path / "shared" / "data" / f"{SMALL_DATASET}.jsonl")
    env_sh = (spec_file.parent / "env" / "n1.sh").read_text()
    assert f"HF_HUB_CACHE={tmp_path / 'shared' / 'models'}" in env_sh.replace("'", "").replace('"', "")
    assert "HF_HUB_OFFLINE" in env_sh
    out = json.loads(sbench("prepare", sw, "-i", inv, "--json").stdout)["items"]
    assert (tmp_path / "shared" / "data" / f"{SMALL_DATASET}.jsonl").is_file()
    assert {i["kind"] for i in out} == {"dataset", "model", "training_data"}


def test_fingerprint_ignores_serialization_but_not_behaviour(tiny_model, tmp_path) -> None:
    """A login node and compute nodes with other tokenizers/transformers versions must agree on the key."""
    from harness.data.tokens import tokenizer_fingerprint

    base = tokenizer_fingerprint(load_tokenizer(str(tiny_model)))
    doc = json.loads((tiny_model / "tokenizer.json").read_text())

    def variant(name: str, edit) -> str:
        d = tmp_path / name
        shutil.copytree(tiny_model, d)
        new = json.loads(json.dumps(doc))
        edit(new)
        (d / "tokenizer.json").write_text(json.dumps(new))
        return tokenizer_fingerprint(load_tokenizer(str(d)))

    def older_format(t):  # what an older tokenizers wrote: merges as "a b" strings, no newer model fields
        t["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in t["model"]["merges"]]
        for k in ("ignore_merges", "byte_fallback"):
            t["model"].pop(k, None)

    def lowercase(t):
        t["normalizer"] = {"type": "Lowercase"}

    def one_merge_less(t):
        t["model"]["merges"] = t["model"]["merges"][:-1]
        last = max(t["model"]["vocab"], key=t["model"]["vocab"].get)
        del t["model"]["vocab"][last]

    # the trainer's pad_token = eos_token (models without a pad token) changes no id: same key as prepare's
    padded = load_tokenizer(str(tiny_model))
    padded.pad_token = padded.eos_token
    assert tokenizer_fingerprint(padded) == base
    assert variant("older", older_format) == base
    assert variant("lower", lowercase) != base
    assert variant("merges", one_merge_less) != base


# -- what prepare says, and how fast it re-checks ------------------------------------------------------------------
def test_prepare_exits_1_once_and_plainly_when_a_model_is_not_visible(tmp_path) -> None:
    hidden = "/sbench-mount-not-here/llama"  # a file system this machine does not mount
    doc = {**sweep_doc("prep-hidden", Path(hidden), tmp_path / "data"), "model_map": {"tiny": hidden}}
    sw = write_yaml(tmp_path / "s.yaml", doc)
    res = sbench("prepare", sw, ok=None)
    assert res.returncode == 1, res.stdout + res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "Traceback" not in res.stderr
    assert f"the model {hidden} is not visible from this machine" in errors[0]
    assert errors[0].endswith(f"prepare on a compute node instead: sbench prepare {sw} --on slurm")
    assert res.stdout.startswith("prepared 3 item(s)") and "1 generated, 2 not_visible" in res.stdout
    out = sbench("prepare", sw, "--json", ok=None)
    assert out.returncode == 1
    doc = json.loads(out.stdout)
    assert "not visible from this machine" in doc["problem"] and doc["nothing"] is None
    assert {(i["kind"], i["status"]) for i in doc["items"]} == {("dataset", "ready"), ("model", "not_visible"),
                                                              ("training_data", "not_visible")}


def test_prepare_with_nothing_to_prepare_says_why(tiny_model, tmp_path) -> None:
    doc = {**sweep_doc("prep-idle", tiny_model, tmp_path / "data"), "runner": {"workload": "idle"}}
    res = sbench("prepare", write_yaml(tmp_path / "s.yaml", doc))
    assert res.stdout.strip() == "nothing to prepare: runner.workload is idle, so its jobs read no model and no data"
    assert not (tmp_path / "data").exists()
    doc = sweep_doc("prep-none", tiny_model, tmp_path / "data", number_gpus=3, batch_size=4)  # rule 1: invalid
    res = sbench("prepare", write_yaml(tmp_path / "n.yaml", doc))
    assert res.stdout.strip() == "nothing to prepare: the sweep has no valid point (sbench plan says why)"


def test_a_recheck_trusts_the_stamp_until_an_input_changes(tiny_model, small, tmp_path, monkeypatch) -> None:
    """Unchanged sizes and mtimes: ready without loading the tokenizer or hashing a byte. A changed mtime: the
    full check again (hashes, same key, ready). Changed content: a new entry is built."""
    import harness.campaign.prepare as prepare_mod
    import harness.data.prepared as prepared_mod
    import harness.data.tokens as tokens_mod
    from harness.data.files import file_sha256
    from harness.spec.inventory import load_inventory
    from harness.spec.plan import plan_sweep
    from harness.spec.sweep import load_sweep

    data = tmp_path / "data"
    data.mkdir()
    dataset = data / small.name
    shutil.copy(small, dataset)
    sw = load_sweep(write_yaml(tmp_path / "s.yaml", sweep_doc("prep-stamp", tiny_model, data)))
    inv = load_inventory(None)

    def check() -> dict:
        (item,) = [i for i in prepare_mod.run_prepare(prepare_mod.work_for(sw, inv, plan_sweep(sw, inv)))
                   if i.kind == "training_data"]
        return {"status": item.status, **item.info}

    first = check()
    assert first["status"] == "built" and first["stamp"] == "no stamp yet"
    hashed: list[str] = []

    def counting_sha(path):
        hashed.append(str(path))
        return file_sha256(path)

    def no_tokenizer(spec):
        raise AssertionError(f"the tokenizer was loaded ({spec})")

    monkeypatch.setattr(prepared_mod, "file_sha256", counting_sha)
    monkeypatch.setattr(tokens_mod, "file_sha256", counting_sha)
    monkeypatch.setattr(prepare_mod, "load_tokenizer", no_tokenizer)
    again = check()
    assert again == {**first, "status": "ready", "stamp": "hit", "token_counts_cache": "hit"} and hashed == []
    # the same bytes, a new mtime: re-hashed (the dataset and the entry), found ready under the same key
    monkeypatch.setattr(prepare_mod, "load_tokenizer", load_tokenizer)
    st = dataset.stat()
    os.utime(dataset, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    touched = check()
    assert touched["status"] == "ready" and touched["key"] == first["key"]
    assert touched["stamp"] == f"{dataset} changed (size or mtime)" and str(dataset) in hashed
    hashed.clear()
    assert check()["stamp"] == "hit" and hashed == []  # the full check stamped it again
    # other content: a new key, built
    with dataset.open("a") as f:
        f.write(dataset.read_text().splitlines()[0] + "\n")
    changed = check()
    assert changed["status"] == "built" and changed["key"] != first["key"] and changed["rows"] == first["rows"] + 1
    # the model's tokenizer files are inputs too
    tok_file = tiny_model / "tokenizer_config.json"
    st = tok_file.stat()
    try:
        os.utime(tok_file, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        assert check()["stamp"] == f"{tok_file} changed (size or mtime)"
    finally:
        os.utime(tok_file, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.slurm
def test_prepare_on_slurm_advises_the_submit_line_that_finds_its_job(tiny_model, small, slurm_cluster,
                                                                     tmp_path) -> None:
    """The submit line it prints carries the inventory (and the work dir) it needs; run as printed, it submits,
    and its arrays wait for that preparation job (or, when it already finished, find everything ready)."""
    import shlex

    from .kit import TEST_INVENTORY

    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(small, data / small.name)
    sw = write_yaml(tmp_path / "s.yaml", {**sweep_doc("prep-advice", tiny_model, data), "partition": "cpu"})
    runs, db = tmp_path / "runs", tmp_path / "r.duckdb"
    res = sbench("prepare", sw, "-i", TEST_INVENTORY, "--on", "slurm", "--workdir", runs)
    job = res.stdout.split()[2]
    (line,) = re.findall(r"; (sbench submit .*?) makes the job arrays wait for it", res.stdout)
    args = shlex.split(line)
    assert args[3:5] == ["-i", str(TEST_INVENTORY)] and args[-2:] == ["--workdir", str(runs)]
    try:
        out = sbench(*args[1:], "--db", db, "--hold", "--json")  # as advised (held: nothing needs to train)
        rep = json.loads(out.stdout)
        assert rep["submitted"] == 1 and rep["executor"] == "slurm"
        if rep["prepare_job"] is not None:
            assert rep["prepare_job"] == job
            deps = subprocess.run(["scontrol", "show", "job", rep["points"][0]["job_id"].split("_")[0]],
                                  capture_output=True, text=True).stdout
            assert f"afterok:{job}" in deps, deps
        else:  # the preparation job had already finished: submit checked and found it all ready
            assert {i["status"] for i in rep["prepare"]} == {"ready"}
    finally:
        sbench("cancel", "--workdir", runs, "--db", db, ok=None)
        subprocess.run(["scancel", job], capture_output=True)
