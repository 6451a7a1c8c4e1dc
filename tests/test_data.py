"""Tiny model, synthetic datasets and exact token counts.

Every length claim is re-checked here independently of the code under test: structure by
string slicing, tokens by calling the Hugging Face tokenizer directly, PNGs by parsing the
chunks with struct/zlib.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
import zlib
from hashlib import sha256
from pathlib import Path

import pytest

from harness.contract.errors import InputError
from harness.data.datagen import dataset_status, ensure_dataset, generate_dataset, read_meta, sidecar_path
from harness.data.tokens import dataset_token_counts, decode_template, encode_for_training

from .kit import ROOT

os.environ.setdefault("HF_HUB_OFFLINE", "1")

CHARS_IDS = {"news-chars-512-entries-4096": 512, "news-chars-1024-entries-4096": 1024,
             "news-chars-2048-entries-4096": 2048}
INPUT_MARK, RESPONSE_MARK = "### Input:\n", "\n\n### Response:\n"


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def split_entry(text: str) -> tuple[str, str, str]:
    """(scaffolding head, input, response) of a text entry, found by the markers alone."""
    assert text.count("### Input:") == 1 and text.count("### Response:") == 1, text[:200]
    i = text.index(INPUT_MARK) + len(INPUT_MARK)
    r = text.index(RESPONSE_MARK)
    return text[:i], text[i:r], text[r + len(RESPONSE_MARK):]


@pytest.fixture(scope="module")
def tok(tiny_model: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


def hf_len(tokenizer, text: str, **kw) -> int:
    return len(tokenizer(text, **kw)["input_ids"])


# -- tiny model --------------------------------------------------------------------------------------------
@pytest.mark.train
def test_tiny_model_loads_offline_and_trains_one_step(tiny_model: Path, tok) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    assert os.environ["HF_HUB_OFFLINE"] == "1"
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    assert model.config.model_type == "llama" and model.config.num_hidden_layers == 2
    assert len(tok) <= model.config.vocab_size == 512
    assert tok.bos_token == "<s>" and tok.eos_token == "</s>" and tok.pad_token == "<pad>"
    assert tok.model_max_length == model.config.max_position_embeddings == 4096
    text = "The city council approved the budget on Monday.\n### Response:\nShares rose 2.1 percent."
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id and tok.decode(ids, skip_special_tokens=True) == text
    # The tokenizer was trained on news prose: common words are single tokens, not bytes.
    assert len(ids) < len(text) / 2

    batch = tok([text, text[:40]], return_tensors="pt", padding=True)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    before = model.model.embed_tokens.weight.detach().clone()
    loss = model(**batch, labels=labels).loss
    loss.backward()
    opt.step()
    assert torch.isfinite(loss)
    assert not torch.equal(before, model.model.embed_tokens.weight)


def test_tiny_model_is_deterministic_per_seed(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from harness.data.tinymodel import make_tiny_model

    a = load_file(make_tiny_model(tmp_path / "a", seed=3) / "model.safetensors")
    b = load_file(make_tiny_model(tmp_path / "b", seed=3) / "model.safetensors")
    c = load_file(make_tiny_model(tmp_path / "c", seed=4) / "model.safetensors")
    assert a.keys() == b.keys() == c.keys()
    assert all((a[k] == b[k]).all() for k in a)
    assert any(not (a[k] == c[k]).all() for k in a)
    assert (tmp_path / "a" / "tokenizer.json").read_bytes() == (tmp_path / "b" / "tokenizer.json").read_bytes()


def test_model_shape_options_reach_the_checkpoint(tmp_path: Path) -> None:
    from safetensors import safe_open

    from harness.data.tinymodel import make_tiny_model

    out = make_tiny_model(tmp_path / "m", hidden_size=64, num_layers=2, num_heads=8, num_kv_heads=2,
                          intermediate_size=96, dtype="bfloat16", device="cpu")
    config = json.loads((out / "config.json").read_text())
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["intermediate_size"]) == (8, 2, 96)
    with safe_open(str(out / "model.safetensors"), framework="pt") as st:
        dtypes = {str(st.get_tensor(k).dtype) for k in st.keys()}
    assert dtypes == {"torch.bfloat16"}
    for bad in ({"num_kv_heads": 3}, {"intermediate_size": 0}, {"dtype": "int8"}, {"device": "tpu"}):
        with pytest.raises(InputError):
            make_tiny_model(tmp_path / "bad", num_heads=8, **bad)


def test_the_1b_size_is_a_llama_of_1_1_billion_parameters() -> None:
    from transformers import LlamaConfig

    from harness.data.tinymodel import SIZES
    from harness.spec.memory import parameter_groups, shape_of

    s = SIZES["1b"]
    cfg = LlamaConfig(vocab_size=s["vocab_size"], hidden_size=s["hidden_size"], num_hidden_layers=s["num_layers"],
                      num_attention_heads=s["num_heads"], num_key_value_heads=s["num_kv_heads"],
                      intermediate_size=s["intermediate_size"], tie_word_embeddings=False)
    total = sum(parameter_groups(shape_of(cfg.to_dict())).values())
    assert 1.0e9 < total < 1.2e9 and s["dtype"] == "bfloat16"


def test_cli_model_tiny_size_builds_a_llama_only(cli, tmp_path: Path) -> None:
    for extra in (["--arch", "qwen2"], ["--vision"]):
        result = cli("model", "tiny", "-o", tmp_path / "x", "--size", "1b", *extra)
        assert result.exit_code == 2 and "--size 1b builds a Llama" in result.output, result.output
    assert not (tmp_path / "x").exists()
    result = cli("model", "tiny", "-o", tmp_path / "t", "--size", "tiny", "--device", "cpu")
    assert result.exit_code == 0, result.output
    assert "139,584 params" in result.output


def test_cli_model_tiny_mixtral_is_a_working_moe(cli, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "moe"
    result = cli("model", "tiny", "-o", out, "--arch", "mixtral", "--seed", "1")
    assert result.exit_code == 0, result.output
    first, summary = result.output.strip().splitlines()[-2:]
    assert first == str(out)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "mixtral"
    assert config["num_local_experts"] == 4 and config["num_experts_per_tok"] == 2
    model = AutoModelForCausalLM.from_pretrained(out)
    n_params = sum(p.numel() for p in model.parameters())
    assert f"{n_params:,} params" in summary and "vocab 512" in summary and "2 layers" in summary
    enc = AutoTokenizer.from_pretrained(out)("Police in Bayside said on Friday.", return_tensors="pt")
    out_ = model(**enc, labels=enc["input_ids"])
    out_.loss.backward()
    expert_grads = [p.grad for n, p in model.named_parameters() if "experts" in n]
    assert expert_grads and any(g is not None and g.abs().sum() > 0 for g in expert_grads)


def test_cli_model_tiny_rejects_unknown_arch(cli, tmp_path: Path) -> None:
    result = cli("model", "tiny", "-o", tmp_path / "m", "--arch", "gpt5")
    assert result.exit_code == 2 and "gpt5" in result.output


# -- text datasets -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("dataset_id", list(CHARS_IDS))
def test_chars_ids_have_exact_lengths(dataset_id: str, tmp_path: Path) -> None:
    n = CHARS_IDS[dataset_id]
    path = tmp_path / f"{dataset_id}.jsonl"
    info = generate_dataset(dataset_id, path, entries=24, seed=5)
    rows = lines(path)
    assert len(rows) == info.entries == 24
    heads = set()
    for row in rows:
        assert list(row) == ["output"]
        head, inp, resp = split_entry(row["output"])
        assert len(inp) == n and len(resp) == n
        # Everything that is neither input nor response is the fixed 127-character prompt.
        assert len(row["output"]) - 2 * n == 127
        assert not inp[0].isspace() and not resp[-1].isspace()
        heads.add(head)
    assert len(heads) == 1  # the scaffolding is fixed
    assert len({r["output"] for r in rows}) == 24  # the prose is not
    assert info.chars == {"min": 2 * n + 127, "avg": 2 * n + 127, "max": 2 * n + 127}


def test_chars_id_full_size_and_determinism(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"
    info = generate_dataset("news-chars-512-entries-4096", a)
    rows = lines(a)
    assert len(rows) == 4096 == info.entries
    assert {len(r["output"]) for r in rows} == {512 + 127 + 512}
    meta = read_meta(a)
    assert meta["entries"] == 4096 and meta["sha256"] == sha256(a.read_bytes()).hexdigest()
    assert meta["size_bytes"] == a.stat().st_size
    assert dataset_status("news-chars-512-entries-4096", a) == "complete"
    generate_dataset("news-chars-512-entries-4096", b, entries=50)
    generate_dataset("news-chars-512-entries-4096", c, entries=50, seed=1)
    assert b.read_text().splitlines() == a.read_text().splitlines()[:50]  # same seed: same entries
    assert b.read_text() != c.read_text()


def test_tokens_id_reaches_16384_tokens_with_the_tiny_tokenizer(tmp_path: Path, tiny_model: Path, tok) -> None:
    path = tmp_path / "n16k.jsonl"
    info = generate_dataset("news-tokens-16384plus-entries-4096", path, tokenizer=str(tiny_model), entries=3)
    recount = [hf_len(tok, r["output"], add_special_tokens=False) for r in lines(path)]
    assert len(recount) == 3 and min(recount) >= 16384
    assert info.tokens["min"] == min(recount) and info.tokens["max"] == max(recount)
    g = read_meta(path)["length_guarantee"]
    assert g["verified"] is True and g["tokenizer"] == str(tiny_model) and g["min_tokens"] == 16384
    for r in lines(path):
        _, inp, resp = split_entry(r["output"])
        assert len(inp) == 512 and len(resp.split()) >= 16384


def test_tokens_id_without_tokenizer_is_guaranteed_by_word_count(tmp_path: Path, tok) -> None:
    path = tmp_path / "n128k.jsonl"
    generate_dataset("news-tokens-128kplus-entries-320", path, entries=1)
    (row,) = lines(path)
    _, _, resp = split_entry(row["output"])
    assert len(resp.split()) >= 128 * 1024
    g = read_meta(path)["length_guarantee"]
    assert g["method"] == "words" and g["verified"] is False and g["min_tokens"] == 131072
    # The bound holds for a real byte-level BPE: every word is at least one token.
    assert hf_len(tok, row["output"], add_special_tokens=False) >= 131072


def test_short_entries_are_extended_until_the_tokenizer_agrees(tmp_path: Path) -> None:
    """A tokenizer that makes one token per sentence defeats the word bound; generation must notice."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Split(".", behavior="removed")
    per_sentence = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    path = tmp_path / "n16k.jsonl"
    generate_dataset("news-tokens-16384plus-entries-4096", path, tokenizer=per_sentence, entries=2)
    for row in lines(path):
        n = len(per_sentence(row["output"], add_special_tokens=False)["input_ids"])
        assert n >= 16384
        assert len(row["output"].split()) > 5 * 16384  # it really had to grow far past the word bound


# -- token counts ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mixed_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Short and long entries in one file, so both sides of min() occur."""
    d = tmp_path_factory.mktemp("ds")
    generate_dataset("news-chars-512-entries-4096", d / "a.jsonl", entries=40)
    generate_dataset("news-tokens-16384plus-entries-4096", d / "b.jsonl", entries=2)
    path = d / "mixed.jsonl"
    path.write_text((d / "a.jsonl").read_text() + (d / "b.jsonl").read_text())
    return path


@pytest.mark.parametrize("max_seq_length", [200, 700, 100_000])
def test_token_counts_match_an_independent_recount(tok, tiny_model: Path, mixed_dataset: Path,
                                                   max_seq_length: int) -> None:
    expected = [min(hf_len(tok, r["output"]), tok.model_max_length, max_seq_length) for r in lines(mixed_dataset)]
    tc = dataset_token_counts(str(tiny_model), mixed_dataset, max_seq_length=max_seq_length)
    assert tc.counts == expected
    assert tc.total == sum(expected) and tc.entries == 42 and tc.cache == "off"
    # The long entries hit the cap (max_seq_length, or model_max_length 4096 for the 100k case)...
    assert tc.counts[-1] == min(max_seq_length, 4096)
    # ...while at 700 and above the short ones keep their own lengths.
    assert max_seq_length == 200 or len(set(tc.counts[:40])) > 1 and max(tc.counts[:40]) < 700


def test_token_counts_ignore_a_sentinel_model_max_length(tok, mixed_dataset: Path) -> None:
    import copy

    huge = copy.deepcopy(tok)
    huge.model_max_length = int(1e30)  # what transformers sets when a tokenizer declares no limit
    tc = dataset_token_counts(huge, mixed_dataset, max_seq_length=9000)
    full = [hf_len(tok, r["output"]) for r in lines(mixed_dataset)]
    assert tc.counts == [min(n, 9000) for n in full]
    assert max(tc.counts) == 9000 > tok.model_max_length


def test_token_count_cache_hits_and_invalidates(tmp_path: Path, tok, tiny_model: Path) -> None:
    from harness.data.tinymodel import train_tokenizer

    data = tmp_path / "d.jsonl"
    generate_dataset("news-chars-1024-entries-4096", data, entries=30)
    cache = tmp_path / "cache"
    first = dataset_token_counts(tok, data, max_seq_length=300, cache_dir=cache)
    again = dataset_token_counts(str(tiny_model), data, max_seq_length=300, cache_dir=cache)
    assert (first.cache, again.cache) == ("miss", "hit")
    assert again.counts == first.counts and again.key == first.key
    assert list(cache.iterdir()) == [cache / f"tokens-{first.key}.json"]

    other_len = dataset_token_counts(tok, data, max_seq_length=250, cache_dir=cache)
    assert other_len.cache == "miss" and other_len.key != first.key and max(other_len.counts) == 250

    other_tok = dataset_token_counts(train_tokenizer(vocab_size=300), data, max_seq_length=300, cache_dir=cache)
    assert other_tok.cache == "miss" and other_tok.key != first.key

    rows = lines(data)
    rows[3]["output"] = rows[3]["output"][:100] + rows[3]["output"][100:].upper()  # same length, new text
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    changed = dataset_token_counts(tok, data, max_seq_length=300, cache_dir=cache)
    assert changed.cache == "miss" and changed.key != first.key
    assert changed.counts[3] == min(hf_len(tok, rows[3]["output"]), 300)

    # A damaged cache file is recounted and rewritten, never trusted.
    (cache / f"tokens-{changed.key}.json").write_text('{"key": "x", "counts": [1]')
    assert dataset_token_counts(tok, data, max_seq_length=300, cache_dir=cache).cache == "miss"
    assert dataset_token_counts(tok, data, max_seq_length=300, cache_dir=cache).cache == "hit"


def test_decode_template() -> None:
    assert decode_template("\\n### Response:") == "\n### Response:"
    assert decode_template("\n### Response:") == "\n### Response:"
    assert decode_template("a\\tb\\\\n\\u00e9\\x41\\d") == "a\tb\\n\u00e9A\\d"


def test_encode_for_training_agrees_with_counts_and_masks_the_prompt(tok, tiny_model: Path, mixed_dataset: Path,
                                                                     tmp_path: Path) -> None:
    msl = 350
    ds = encode_for_training(str(tiny_model), mixed_dataset, text_field="output", max_seq_length=msl,
                             response_template="\\n### Response:", cache_dir=tmp_path)
    # Encoding filled the count cache: counting afterwards is a hit, and a fresh count agrees with it.
    tc = dataset_token_counts(tok, mixed_dataset, max_seq_length=msl, cache_dir=tmp_path)
    assert tc.cache == "hit"
    assert dataset_token_counts(tok, mixed_dataset, max_seq_length=msl).counts == tc.counts
    assert ds.column_names == ["input_ids", "completion_mask"] and len(ds) == tc.entries
    assert [len(x) for x in ds["input_ids"]] == tc.counts
    rows = lines(mixed_dataset)
    for row, ids, mask in zip(rows, ds["input_ids"], ds["completion_mask"]):
        text = row["output"]
        enc = tok(text, return_offsets_mapping=True, truncation=True, max_length=msl)
        assert ids == enc["input_ids"]
        assert len(mask) == len(ids) and mask == sorted(mask)  # prompt zeros, then response ones
        start = text.index("### Response:") + len("### Response:")
        expected_first = next((j for j, (s, e) in enumerate(enc["offset_mapping"]) if e > s and s >= start), None)
        if expected_first is None:  # truncated inside the prompt: nothing to learn from
            assert sum(mask) == 0
            continue
        assert mask.index(1) == expected_first
        assert text[:enc["offset_mapping"][expected_first][0]].endswith("### Response:")
        if len(ids) < msl:  # untruncated: the masked-in tokens are exactly the response
            assert tok.decode([t for t, m in zip(ids, mask) if m]) == text[start:]


@pytest.mark.train
@pytest.mark.filterwarnings("ignore::FutureWarning")  # transformers' own deprecation notices inside SFTConfig
def test_encoded_dataset_trains_with_trl(tiny_model: Path, mixed_dataset: Path, tmp_path: Path) -> None:
    """The real consumer: trl's SFTTrainer takes the pre-tokenized set and masks the prompt out of the loss."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    ds = encode_for_training(tokenizer, mixed_dataset, max_seq_length=300, response_template="\\n### Response:")
    args = SFTConfig(output_dir=str(tmp_path / "out"), max_steps=1, per_device_train_batch_size=2,
                     completion_only_loss=True, max_length=300, report_to=[], save_strategy="no",
                     logging_steps=1, use_cpu=True, dataloader_num_workers=0)
    trainer = SFTTrainer(model=AutoModelForCausalLM.from_pretrained(tiny_model), args=args, train_dataset=ds,
                         processing_class=tokenizer)
    # trl folds completion_mask into labels during preparation (completion_only_loss=True is required for that).
    prepared = trainer.train_dataset
    assert len(prepared) == len(ds)  # no row lost its whole response to truncation at this length
    for i in (0, len(ds) - 1):
        ids, mask, labels = ds[i]["input_ids"], ds[i]["completion_mask"], prepared[i]["labels"]
        assert prepared[i]["input_ids"] == ids
        assert labels == [t if m else -100 for t, m in zip(ids, mask)]
        assert 0 < labels.count(-100) < len(labels)
    batch = trainer.data_collator([prepared[0], prepared[1]])
    assert (batch["labels"][0, :ds[0]["completion_mask"].index(1)] == -100).all()
    result = trainer.train()
    assert result.global_step == 1
    assert trainer.state.log_history and "loss" in trainer.state.log_history[0]


# -- vision ------------------------------------------------------------------------------------------------
def parse_png(data: bytes) -> tuple[int, int, int]:
    """(width, height, decompressed scanline bytes) of a PNG, checking signature and CRCs."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height = 8, b"", 0, 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        tag, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        assert struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])[0] == zlib.crc32(tag + body)
        if tag == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
            assert (depth, color) == (8, 2)
        elif tag == b"IDAT":
            idat += body
        pos += 12 + length
    return width, height, len(zlib.decompress(idat))


@pytest.mark.parametrize("dataset_id,size", [("vision-384x384-16384plus-entries-4096", (384, 384)),
                                             ("vision-384x768-16384plus-entries-4096", (384, 768))])
def test_vision_ids_write_a_readable_parquet(dataset_id: str, size: tuple[int, int], tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    path = tmp_path / f"{dataset_id}.parquet"
    generate_dataset(dataset_id, path, entries=6)
    table = pq.read_table(path)
    assert table.num_rows == 6 and {"images", "output"} <= set(table.column_names)
    meta = read_meta(path)
    g = meta["length_guarantee"]
    assert g["verified"] is False and "NOT checked" in g["detail"]
    assert g["copies_per_entry"] * g["estimated_tokens_per_image"] >= 16384
    for row in table.to_pylist():
        images = row["images"]
        assert len(images) == g["copies_per_entry"] and len({im["bytes"] for im in images}) == 1
        w, h, raw = parse_png(images[0]["bytes"])
        assert (w, h) == size and raw == h * (w * 3 + 1)
        assert row["output"].count("<image>") == len(images)
        split_entry(row["output"])
    hf_features = json.loads(pq.read_schema(path).metadata[b"huggingface"])["info"]["features"]
    assert hf_features["images"]["feature"]["_type"] == "Image"  # datasets decodes them as images


# -- CLI ---------------------------------------------------------------------------------------------------
def test_cli_dataset_generate_and_count(cli, tmp_path: Path, tiny_model: Path, tok) -> None:
    out = tmp_path / "c.jsonl"
    r = cli("dataset", "generate", "news-chars-2048-entries-4096", "-o", out, "--entries", "12",
            "--tokenizer", tiny_model)
    assert r.exit_code == 0, r.output
    toks = [hf_len(tok, x["output"], add_special_tokens=False) for x in lines(out)]
    assert "entries 12; characters min 4223 / avg 4223 / max 4223" in r.output
    assert f"min {min(toks)} / avg {sum(toks) / 12:g} / max {max(toks)}" in r.output
    r = cli("dataset", "count", out, "--tokenizer", tiny_model, "--max-seq-length", "700",
            "--cache-dir", tmp_path / "cc", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["total"] == sum(min(hf_len(tok, x["output"]), 700) for x in lines(out))
    assert (doc["entries"], doc["cache"]) == (12, "miss")
    r = cli("dataset", "count", out, "--tokenizer", tiny_model, "--max-seq-length", "700", "--cache-dir",
            tmp_path / "cc")
    assert r.exit_code == 0 and f"total {doc['total']} tokens over 12 entries" in r.output and "cache hit" in r.output


@pytest.mark.parametrize("args,needle", [
    (["dataset", "generate", "news-chars-999-entries-4096", "-o", "{tmp}/x.jsonl"], "news-chars-512-entries-4096"),
    (["dataset", "generate", "news-chars-512-entries-4096", "-o", "{tmp}/x.jsonl", "--entries", "0"], "--entries"),
    (["dataset", "generate", "news-chars-512-entries-4096", "-o", "{tmp}/x.jsonl", "--tokenizer", "{tmp}/none"],
     "does not exist"),
    (["dataset", "generate", "vision-384x384-16384plus-entries-4096", "-o", "{tmp}/v.jsonl"], "*.parquet"),
    (["dataset", "count", "{tmp}/missing.jsonl", "--tokenizer", "{model}", "--max-seq-length", "9"],
     "sbench dataset generate"),
    (["dataset", "count", "{tmp}/bad.jsonl", "--tokenizer", "{model}", "--max-seq-length", "9"], "bad.jsonl:2"),
    (["dataset", "count", "{tmp}/bad.jsonl", "--tokenizer", "{model}", "--max-seq-length", "0"], "max-seq-length"),
])
def test_cli_input_errors_exit_2_without_traceback(cli, tmp_path: Path, tiny_model: Path, args, needle) -> None:
    (tmp_path / "bad.jsonl").write_text('{"output": "ok"}\n{"text": "no output field"}\n')
    r = cli(*[a.format(tmp=tmp_path, model=tiny_model) for a in args])
    assert r.exit_code == 2, r.output
    assert needle in r.output and "Traceback" not in r.output


def test_library_rejects_unknown_id_listing_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="valid ids: .*vision-384x768-16384plus-entries-4096"):
        ensure_dataset("news", tmp_path / "x.jsonl")


# -- concurrency and crashes -------------------------------------------------------------------------------
_ENSURE = """
import sys, time
from pathlib import Path
from harness.data import datagen as dg
real = dg._generate_locked
def counted(*a, **kw):  # report each real generation, so the test can tell that the lock made one
    print("generated", flush=True)
    return real(*a, **kw)
dg._generate_locked = counted
go = Path(sys.argv[2])
while not go.exists():
    time.sleep(0.01)
dg.ensure_dataset("news-chars-512-entries-4096", sys.argv[1])
print("done")
"""


def test_concurrent_ensure_dataset_makes_one_valid_file(tmp_path: Path) -> None:
    path, go = tmp_path / "shared" / "news-chars-512-entries-4096.jsonl", tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", _ENSURE, str(path), str(go)], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    time.sleep(0.5)
    go.touch()  # release both at once
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert [o.split() for o, _ in outs].count(["generated", "done"]) == 1  # one generated, the other waited
    assert sorted(o.split()[-1] for o, _ in outs) == ["done", "done"]
    rows = lines(path)
    assert len(rows) == 4096 and {len(r["output"]) for r in rows} == {1151}
    assert read_meta(path)["sha256"] == sha256(path.read_bytes()).hexdigest()
    assert dataset_status("news-chars-512-entries-4096", path) == "complete"
    assert sorted(p.name for p in path.parent.iterdir()) == sorted(
        [path.name, path.name + ".meta.json", path.name + ".lock"])  # no temp files left behind
    mtime = path.stat().st_mtime_ns
    assert ensure_dataset("news-chars-512-entries-4096", path) == path and path.stat().st_mtime_ns == mtime


_GENERATE = """
import sys
from harness.data.datagen import generate_dataset
generate_dataset("news-tokens-16384plus-entries-4096", sys.argv[1])
"""


def test_a_killed_generator_leaves_nothing_that_looks_complete(tmp_path: Path) -> None:
    path = tmp_path / "n16k.jsonl"
    proc = subprocess.Popen([sys.executable, "-c", _GENERATE, str(path)], cwd=ROOT)
    deadline = time.monotonic() + 30
    def partial() -> bool:
        for p in tmp_path.iterdir():
            try:
                if p.name.startswith(f".{path.name}.tmp-data") and p.stat().st_size > 1 << 20:
                    return True
            except FileNotFoundError:
                pass
        return False

    while not partial() and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert partial()  # it really died mid-write
    assert not path.exists() and not sidecar_path(path).exists()
    assert dataset_status("news-tokens-16384plus-entries-4096", path) == "missing"
    # The next generator (here a small one) cleans up the dead one's temp file.
    generate_dataset("news-tokens-16384plus-entries-4096", path, entries=1)
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]
    assert dataset_status("news-tokens-16384plus-entries-4096", path) == "stale"  # 1 entry is not the id's 4096


def test_ensure_dataset_regenerates_stale_and_keeps_foreign_files(tmp_path: Path) -> None:
    ours = tmp_path / "ours.jsonl"
    generate_dataset("news-chars-512-entries-4096", ours, entries=3)
    assert dataset_status("news-chars-512-entries-4096", ours) == "stale"
    ensure_dataset("news-chars-512-entries-4096", ours)
    assert len(lines(ours)) == 4096 and dataset_status("news-chars-512-entries-4096", ours) == "complete"

    foreign = tmp_path / "foreign.jsonl"
    foreign.write_text('{"output": "reference data copied in by hand"}\n')
    assert dataset_status("news-chars-512-entries-4096", foreign) == "external"
    ensure_dataset("news-chars-512-entries-4096", foreign)
    assert lines(foreign) == [{"output": "reference data copied in by hand"}]
