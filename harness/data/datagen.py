"""Synthetic benchmark datasets, generated locally and deterministically.

The reference experiments name their datasets by id (``news-chars-512-entries-4096``,
``news-tokens-16384plus-entries-4096``, ...). sbench makes each one from a seed instead of
downloading it, so every node of every cluster trains on byte-identical data:

* text ids -> JSONL, one ``{"output": ...}`` object per line, each entry in the form
  ``<instruction>### Input:\\n<input>\\n\\n### Response:\\n<response>`` (the trainer runs with
  ``--dataset_text_field output --response_template "\\n### Response:"``);
* vision ids -> Parquet with an ``images`` column (the same synthetic PNG, repeated) and the
  same ``output`` text column.

A sidecar ``<file>.meta.json`` records what was generated and how long entries were
guaranteed to be. ``ensure_dataset`` uses it to decide whether a file is complete, so the
runner on many nodes can call it at once on a shared filesystem: one generates under a
lock, the others wait and then reuse the file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import re
import socket
import struct
import time
import zlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import IO, Any

from harness.contract.errors import InputError, SbenchError
from harness.contract.formats import IMAGE_FIELD, MESSAGES_FIELD, RESPONSE_TEMPLATE, TEXT_FIELD
from harness.contract.paths import dataset_filename, dataset_format
from harness.spec.catalog import DATASET_IDS, VISION_ID_RE

from .files import file_sha256, fsync, locked
from .tokens import load_tokenizer, tokenizer_name
from .vision import count_entry, entry_text, image_token_id, load_processor, vision_token_counts

GENERATOR_VERSION = 2  # 2: vision datasets carry their chat messages

# The fixed scaffolding around input and response: 111 + 16 = 127 characters, the "+ 127
# (prompt)" of the reference dataset descriptions. tests/test_data.py holds us to that number.
PROMPT_HEAD = ("Below is the start of a news story. Write the next part of the story in the same style "
               "and length.\n\n### Input:\n")
PROMPT_MID = "\n" + RESPONSE_TEMPLATE + "\n"
SCAFFOLD_CHARS = len(PROMPT_HEAD) + len(PROMPT_MID)
IMAGE_TOKEN = "<image>"
VISION_PROMPT = "Describe what these pictures show, as a news caption."


def vision_messages(images: int, response: str) -> list[dict[str, Any]]:
    """A vision entry's chat: the user turn's *images* image items and the prompt, the assistant's response.
    Every item has both struct fields (Parquet's shape); ``text`` is None on an image item."""
    return [{"role": "user", "content": [{"type": "image", "text": None}] * images
             + [{"type": "text", "text": VISION_PROMPT}]},
            {"role": "assistant", "content": [{"type": "text", "text": response}]}]

# Input of the long (tokens) entries: a short lead, so the response template stays inside
# any sensible max_seq_length and completion-only loss always has tokens to learn from.
TOKENS_LEAD_CHARS = 512

# Image tokens one copy of a 384-pixel-tile image costs in granite-vision-3.2-2b (LLaVA-NeXT
# anyres, SigLIP 384/14 -> 27x27 = 729 features per tile): base image 729 + tiles (27 rows of
# 27*cols features + one newline feature per row). This is an ESTIMATE from the model's
# published geometry; sbench cannot load that processor offline, so meta.json says so.
_TILE = 384
_FEAT = 27


def estimated_image_tokens(width: int, height: int) -> int:
    """Image tokens granite-vision-3.2-2b spends on one image of this size (estimate, see above)."""
    cols, rows = -(-width // _TILE), -(-height // _TILE)
    return _FEAT * _FEAT + (_FEAT * rows) * (_FEAT * cols + 1)


# -- dataset ids --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DatasetSpec:
    """What a dataset id means: its kind, entry count and per-entry size."""

    dataset_id: str
    kind: str  # "chars" | "tokens" | "vision"
    entries: int
    chars: int = 0  # chars: characters of the input and of the response
    min_tokens: int = 0  # tokens / vision: tokens every entry reaches
    width: int = 0  # vision: image width in pixels
    height: int = 0  # vision: image height in pixels

    @property
    def fmt(self) -> str:
        return dataset_format(self.dataset_id)

    @property
    def filename(self) -> str:
        """The file name the job spec expects under the sweep's data_dir."""
        return dataset_filename(self.dataset_id)


_CHARS_RE = re.compile(r"news-chars-(\d+)-entries-(\d+)")
_TOKENS_RE = re.compile(r"news-tokens-(\d+)(k?)plus-entries-(\d+)")
_VISION_RE = VISION_ID_RE


def parse_dataset_id(dataset_id: str) -> DatasetSpec:
    """The spec of a catalog dataset id; ``InputError`` listing the valid ids for anything else."""
    if dataset_id not in DATASET_IDS:
        raise InputError(f"unknown dataset id {dataset_id!r}; valid ids: {', '.join(DATASET_IDS)}")
    if m := _CHARS_RE.fullmatch(dataset_id):
        return DatasetSpec(dataset_id, "chars", entries=int(m[2]), chars=int(m[1]))
    if m := _TOKENS_RE.fullmatch(dataset_id):
        n = int(m[1]) * (1024 if m[2] else 1)
        return DatasetSpec(dataset_id, "tokens", entries=int(m[3]), min_tokens=n)
    if m := _VISION_RE.fullmatch(dataset_id):
        # "384x768" is read as width x height, the usual order for image sizes.
        return DatasetSpec(dataset_id, "vision", entries=int(m[4]), min_tokens=int(m[3]),
                           width=int(m[1]), height=int(m[2]))
    raise InputError(f"dataset id {dataset_id!r} is in the catalog but sbench cannot generate it")  # pragma: no cover


# -- news prose ---------------------------------------------------------------------------------------------
# Word source for the datasets and for the tiny model's tokenizer (harness.tinymodel trains on
# news_corpus(), so its merges fit the data it will see).
_CITIES = ("Springfield", "Riverton", "Lakeview", "Northbridge", "Port Ellis", "Millbrook", "Eastwood",
           "Granite Falls", "Cedar Hill", "Westhaven", "Oakridge", "Fairmont", "Bayside", "Kingsford",
           "Ashford", "Silver Bay", "Highland Park", "Clearwater", "Brookfield", "Stonegate")
_TITLES = ("Mayor", "Senator", "Minister", "Professor", "Judge", "Governor", "Director", "Councillor",
           "Chief Inspector", "Dr.", "Commissioner", "Chancellor")
_SURNAMES = ("Alvarez", "Bennett", "Chen", "Dubois", "Evans", "Fischer", "Garcia", "Hughes", "Ivanova",
             "Johnson", "Kowalski", "Lindqvist", "Morgan", "Nakamura", "Okafor", "Patel", "Quinn", "Rossi",
             "Schmidt", "Tanaka", "Usman", "Varga", "Walsh", "Young", "Zhang")
_ORGS = ("city council", "central bank", "health ministry", "transport authority", "school board",
         "state legislature", "energy regulator", "planning committee", "finance ministry", "port authority",
         "water utility", "police department", "county court", "trade union", "chamber of commerce")
_COMPANIES = ("Northwind Energy", "Bluefield Motors", "Harbor Logistics", "Summit Foods", "Apex Telecom",
              "Greenline Rail", "Ironclad Steel", "Brightway Pharma", "Crescent Airlines", "Vista Software")
_SECTORS = ("energy", "housing", "transport", "education", "health care", "farming", "tourism", "technology",
            "manufacturing", "retail", "shipping", "banking")
_NOUNS = ("budget", "proposal", "report", "plan", "policy", "contract", "investigation", "reform", "project",
          "agreement", "inquiry", "programme", "strategy", "review", "ruling", "deal", "scheme", "forecast")
_VERBS = (("approve", "approved"), ("reject", "rejected"), ("announce", "announced"), ("delay", "delayed"),
          ("review", "reviewed"), ("unveil", "unveiled"), ("defend", "defended"), ("expand", "expanded"),
          ("suspend", "suspended"), ("revise", "revised"), ("fund", "funded"), ("challenge", "challenged"))
_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December")
_ADVERBIALS = ("after months of debate", "despite strong opposition", "amid rising costs",
               "following a public consultation", "ahead of the election", "in a closed session",
               "after a lengthy review", "under pressure from residents", "for the second time this year",
               "without a formal vote", "in response to the findings")
_SOURCES = ("officials familiar with the matter", "a spokesperson", "local media", "court documents",
            "a statement released by the office", "people close to the negotiations", "the latest figures",
            "an internal memo")
_ISSUES = ("the shortage of affordable homes", "long waiting times", "rising energy bills", "traffic congestion",
           "the lack of skilled workers", "flooding along the river", "falling school enrolment",
           "air quality near the port")
_INCIDENTS = ("a collision on the ring road", "a fire at a warehouse", "a gas leak near the station",
              "a storm that struck overnight", "a power cut in the old town")

_TEMPLATES = (
    "{title} {surname} said on {day} that the {org} would {verb} the {sector} {noun} {adverbial}.",
    "The {org} in {city} {verbed} a {money} {sector} {noun} on {day}, according to {sources}.",
    "In {city}, {sources} said the {noun} had been {verbed} {adverbial}.",
    "Analysts expect {sector} prices to rise by {pct} over the next {n} months.",
    "\"We will {verb} this {noun} {adverbial},\" {title} {surname} told reporters in {city}.",
    "Residents of {city} {verbed} the {org}'s {noun} at a public meeting on {day} evening.",
    "The {noun} follows a {pct} fall in {sector} spending last year, {sources} said.",
    "Shares in {company} rose {pct} on {day} after the firm {verbed} its annual {noun}.",
    "Police in {city} said {n} people were treated in hospital after {incident} on {day}.",
    "{company} said it would hire {count} workers in {city} by the end of {year}.",
    "Critics argue that the {noun} does little to address {issue} in {city}.",
    "The vote on the {sector} {noun} is expected in {month}, {sources} said.",
    "{title} {surname}, who has led the {org} since {year}, declined to comment on the {noun}.",
    "The {org} estimates that the {noun} will cost {money} over {n} years.",
    "Figures published on {day} showed {sector} output grew by {pct} in {month}.",
    "Opposition members called the {noun} {adj} and said the {org} had ignored {issue}.",
)
_ADJECTIVES = ("rushed", "unfair", "overdue", "costly", "reckless", "welcome", "modest", "ambitious", "vague")


def _sentence(rng: random.Random) -> str:
    verb, verbed = rng.choice(_VERBS)
    slots = {
        "title": rng.choice(_TITLES), "surname": rng.choice(_SURNAMES), "org": rng.choice(_ORGS),
        "city": rng.choice(_CITIES), "company": rng.choice(_COMPANIES), "sector": rng.choice(_SECTORS),
        "noun": rng.choice(_NOUNS), "verb": verb, "verbed": verbed, "day": rng.choice(_DAYS),
        "month": rng.choice(_MONTHS), "adverbial": rng.choice(_ADVERBIALS), "sources": rng.choice(_SOURCES),
        "issue": rng.choice(_ISSUES), "incident": rng.choice(_INCIDENTS), "adj": rng.choice(_ADJECTIVES),
        "n": rng.randint(2, 40), "count": f"{rng.randint(1, 9)},{rng.randint(0, 999):03d}",
        "pct": f"{rng.randint(1, 19)}.{rng.randint(0, 9)} percent", "year": rng.randint(1998, 2026),
        "money": f"${rng.randint(2, 950)} million",
    }
    return rng.choice(_TEMPLATES).format(**slots)


_POOL_SIZE = 8192


@lru_cache(maxsize=4)
def _sentence_pool(seed: int) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """A fixed pool of sentences and their whitespace-separated word counts.

    Entries are drawn from a pool rather than built word by word: the long ids need ~67
    million words, and picking whole sentences keeps generation to seconds.
    """
    rng = random.Random(f"sbench-news-pool:{seed}")
    sentences = tuple(_sentence(rng) for _ in range(_POOL_SIZE))
    return sentences, tuple(len(s.split()) for s in sentences)


def news_corpus(n_chars: int, *, seed: int = 0) -> Iterator[str]:
    """Yield whole dataset-style entries (scaffolding included) until ``n_chars`` characters."""
    rng = random.Random(f"sbench-news-corpus:{seed}")
    pool, _ = _sentence_pool(seed)
    total = 0
    while total < n_chars:
        text = PROMPT_HEAD + _chars_text(rng, pool, 512) + PROMPT_MID + _chars_text(rng, pool, 1024)
        total += len(text)
        yield text


def _chars_text(rng: random.Random, pool: tuple[str, ...], n: int) -> str:
    """Exactly ``n`` characters of news prose: whole sentences, the last one cut at ``n``."""
    parts: list[str] = []
    length = -1
    while length < n:
        s = pool[rng.randrange(len(pool))]
        parts.append(s)
        length += len(s) + 1
    text = " ".join(parts)[:n]
    # A cut right after a word would leave a trailing blank; end the sentence instead.
    return text[:-1] + "." if text.endswith(" ") else text


_PARAGRAPH_RHYTHM = (5, 3, 7, 4, 6, 8, 4, 5)


def _words_text(rng: random.Random, pool: tuple[str, ...], counts: tuple[int, ...], min_words: int) -> str:
    """News paragraphs with at least ``min_words`` whitespace-separated words (counted exactly)."""
    picks: list[str] = []
    words = 0
    size = len(pool)
    while words < min_words:
        # Draw in chunks: one rng call per ~16 words would dominate the run time otherwise.
        for j in rng.choices(range(size), k=max(16, (min_words - words) // 14 + 1)):
            picks.append(pool[j])
            words += counts[j]
            if words >= min_words:
                break
    paragraphs, i, k = [], 0, 0
    while i < len(picks):
        step = _PARAGRAPH_RHYTHM[k % len(_PARAGRAPH_RHYTHM)]
        paragraphs.append(" ".join(picks[i:i + step]))
        i, k = i + step, k + 1
    return "\n\n".join(paragraphs)


def _entry(input_text: str, response: str) -> str:
    return PROMPT_HEAD + input_text + PROMPT_MID + response


# -- results ------------------------------------------------------------------------------------------------
@dataclass
class DatasetInfo:
    """What ``generate_dataset`` wrote: the file, its hash, size statistics and the length guarantee."""

    dataset_id: str
    path: Path
    format: str
    entries: int
    seed: int
    generator_version: int
    sha256: str
    size_bytes: int
    chars: dict[str, float]  # min / avg / max characters of the text field
    length_guarantee: dict[str, Any]
    tokens: dict[str, float] | None = None  # min / avg / max tokens when a tokenizer was given
    tokenizer: str | None = None
    elapsed_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["path"] = str(self.path)
        return d


def sidecar_path(path: str | os.PathLike[str]) -> Path:
    """The sidecar of a dataset file: ``<path>.meta.json``."""
    p = Path(path)
    return p.with_name(p.name + ".meta.json")


def read_meta(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The sidecar's content, or None when it is missing or unreadable."""
    try:
        return json.loads(sidecar_path(path).read_text())
    except (OSError, ValueError):
        return None


# -- tokenizer checks ---------------------------------------------------------------------------------------
class _TokenLengths:
    """Counts tokens of whole texts (no special tokens, no truncation) as fast as the tokenizer allows."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self.backend = None
        if backend is not None:
            from tokenizers import Tokenizer  # heavy: only where text is tokenized

            # A private copy: the caller's tokenizer may carry truncation/padding state from earlier calls.
            self.backend = Tokenizer.from_str(backend.to_str())
            self.backend.no_truncation()
            self.backend.no_padding()

    def __call__(self, texts: list[str]) -> list[int]:
        if self.backend is not None:
            return [len(e) for e in self.backend.encode_batch_fast(texts, add_special_tokens=False)]
        ids = self.tokenizer(texts, add_special_tokens=False, return_attention_mask=False)["input_ids"]
        return [len(x) for x in ids]


def _stats(values: list[int]) -> dict[str, float]:
    if not values:
        return {"min": 0, "avg": 0.0, "max": 0}
    return {"min": min(values), "avg": round(sum(values) / len(values), 2), "max": max(values)}


# -- writing ------------------------------------------------------------------------------------------------
_MAX_EXTENSIONS = 64


def _text_entries(spec: DatasetSpec, n: int, seed: int, lengths: _TokenLengths | None,
                  stats: dict[str, list[int]]) -> Iterator[str]:
    """Yield the ``output`` text of each entry, checked against the tokenizer when one is given."""
    pool, counts = _sentence_pool(seed)
    batch = 32 if spec.kind == "tokens" else 256
    for start in range(0, n, batch):
        texts = []
        for i in range(start, min(n, start + batch)):
            # One rng per entry: an entry does not depend on how the ones before it were extended.
            rng = random.Random(f"sbench:{spec.dataset_id}:{seed}:{i}")
            if spec.kind == "chars":
                texts.append(_entry(_chars_text(rng, pool, spec.chars), _chars_text(rng, pool, spec.chars)))
            else:
                # The response alone has >= min_tokens words; _text_guarantee says why that suffices.
                lead = _chars_text(rng, pool, TOKENS_LEAD_CHARS)
                texts.append(_entry(lead, _words_text(rng, pool, counts, spec.min_tokens)))
        if lengths is not None:
            toks = lengths(texts)
            if spec.kind == "tokens":
                texts, toks = _extend_short(texts, toks, spec, seed, start, lengths, pool, counts)
            stats["tokens"].extend(toks)
        stats["chars"].extend(len(t) for t in texts)
        yield from texts


def _extend_short(texts: list[str], toks: list[int], spec: DatasetSpec, seed: int, start: int,
                  lengths: _TokenLengths, pool: tuple[str, ...],
                  counts: tuple[int, ...]) -> tuple[list[str], list[int]]:
    """Append paragraphs to every entry that the tokenizer finds shorter than ``min_tokens``."""
    texts, toks = list(texts), list(toks)
    for j, n_tok in enumerate(toks):
        rng = random.Random(f"sbench-extend:{spec.dataset_id}:{seed}:{start + j}")
        rounds = 0
        while n_tok < spec.min_tokens:
            rounds += 1
            if rounds > _MAX_EXTENSIONS:
                raise SbenchError(f"entry {start + j} of {spec.dataset_id}: the tokenizer still gives {n_tok} < "
                                  f"{spec.min_tokens} tokens after {_MAX_EXTENSIONS} extensions; it does not "
                                  "look like a text tokenizer")
            # Scale the deficit by this tokenizer's observed words per token (>= 1), with 10% to spare,
            # so even a tokenizer that merges across words converges in a few rounds.
            per_token = max(1.0, len(texts[j].split()) / max(1, n_tok))
            need = int((spec.min_tokens - n_tok) * per_token * 1.1) + 16
            texts[j] += "\n\n" + _words_text(rng, pool, counts, need)
            n_tok = lengths([texts[j]])[0]
        toks[j] = n_tok
    return texts, toks


class _HashingWriter:
    """A binary file that hashes what passes through it (so the sidecar's sha256 costs no re-read)."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f, self.sha, self.size = f, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        return self.f.write(data)


def _write_jsonl(f: IO[bytes], texts: Iterator[str]) -> tuple[str, int, int]:
    out = _HashingWriter(f)
    n, buf = 0, []
    for text in texts:
        buf.append(json.dumps({TEXT_FIELD: text}, ensure_ascii=False))
        n += 1
        if len(buf) >= 64:
            out.write(("\n".join(buf) + "\n").encode())
            buf = []
    if buf:
        out.write(("\n".join(buf) + "\n").encode())
    return out.sha.hexdigest(), out.size, n


def _png(width: int, height: int, seed: int) -> bytes:
    """An RGB PNG (written with zlib+struct: Pillow is not a dependency) of a simple synthetic scene.

    A banded gradient with a few flat rectangles, stored with the PNG "Up" filter: rows that
    repeat the one above compress to almost nothing, which keeps a 4096-row dataset of
    repeated copies cheap to write.
    """
    import numpy as np  # heavy: only where arrays are built

    rng = np.random.default_rng(seed)
    x = np.arange(width)[None, :, None]
    y = np.arange(height)[:, None, None]
    img = np.zeros((height, width, 3), dtype=np.uint8)
    img[...] = np.concatenate([np.broadcast_to((x // 16) * 16 * 255 // max(1, width), (height, width, 1)),
                               np.broadcast_to((y // 16) * 16 * 255 // max(1, height), (height, width, 1)),
                               np.full((height, width, 1), 96)], axis=-1).astype(np.uint8)
    for _ in range(6):  # flat "objects" so the picture is not a pure gradient
        w, h = int(rng.integers(16, max(17, width // 3))), int(rng.integers(16, max(17, height // 3)))
        x0, y0 = int(rng.integers(0, max(1, width - w))), int(rng.integers(0, max(1, height - h)))
        img[y0:y0 + h, x0:x0 + w] = rng.integers(0, 256, 3, dtype=np.uint8)
    rows = img.reshape(height, width * 3)
    up = rows.copy()
    up[1:] = rows[1:] - rows[:-1]  # filter type 2 (Up): uint8 arithmetic wraps modulo 256 as PNG requires
    raw = np.concatenate([np.full((height, 1), 2, dtype=np.uint8), up], axis=1).tobytes()

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB, deflate, adaptive, no interlace
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def _processor_copies(spec: DatasetSpec, processor: Any, png: bytes, pool: Any, seed: int) -> tuple[int, int]:
    """(image copies per entry, image tokens per copy) with the model's own processor: the copies that bring
    the text of the shortest probe entry to ``min_tokens`` counting every token the model sees."""
    import io

    from PIL import Image  # heavy: only where images are decoded

    image = Image.open(io.BytesIO(png)).convert("RGB")
    image_id = image_token_id(processor)
    response = _chars_text(random.Random(f"sbench:{spec.dataset_id}:{seed}:probe"), pool, 512)
    one = count_entry(processor, entry_text(processor, {MESSAGES_FIELD: vision_messages(1, response)}), [image],
                      image_id)
    two = count_entry(processor, entry_text(processor, {MESSAGES_FIELD: vision_messages(2, response)}),
                      [image, image], image_id)
    per_image = two[0] - one[0]
    if per_image <= 0 or two[1] - one[1] <= 0:
        raise InputError(f"the processor adds no image tokens for a {spec.width}x{spec.height} image; it is not a "
                         "vision-language model's processor")
    text = one[0] - per_image
    return max(1, -(-(spec.min_tokens - text) // per_image)), per_image


def _write_parquet(tmp: Path, spec: DatasetSpec, n: int, seed: int, stats: dict[str, list[int]],
                   processor_source: Any = None) -> tuple[str, int, int, dict[str, Any]]:
    """The vision entries; with *processor_source* (a vision-language model's directory or processor) the
    image copies per entry come from its exact count, and every entry is counted after it is written."""
    import pyarrow as pa  # heavy: only where Arrow or Parquet data is read or written
    import pyarrow.parquet as pq  # heavy: only where Arrow or Parquet data is read or written
    from datasets import Features, Image, List, Value  # heavy: only where a dataset is opened

    png = _png(spec.width, spec.height, seed)
    pool, _ = _sentence_pool(seed)
    processor = None
    if processor_source is not None:
        try:
            processor = load_processor(processor_source)
        except (OSError, ValueError, KeyError) as exc:
            raise InputError(f"--tokenizer {processor_source}: a vision dataset is counted with a vision-language "
                             f"model's processor, which could not be loaded from it ({exc})") from None
        if getattr(processor, "image_processor", None) is None:
            raise InputError(f"--tokenizer {processor_source}: a vision dataset is counted with a vision-language "
                             "model's processor; this is a text tokenizer (no image processor)")
        copies, per_image = _processor_copies(spec, processor, png, pool, seed)
    else:
        per_image = estimated_image_tokens(spec.width, spec.height)
        copies = -(-spec.min_tokens // per_image)
    # The Hugging Face feature types travel in the schema metadata, so datasets.load_dataset
    # ("parquet") sees `images` as a list of Image() (decoded lazily, with Pillow, on access).
    # MESSAGES_FIELD: the chat both trainers render with the processor's template (fms-hf-tuning finds the
    # column by its name); TEXT_FIELD: the same entry flat, an <image> token per image.
    item = {"type": Value("string"), "text": Value("string")}
    schema = Features({IMAGE_FIELD: List(Image()), MESSAGES_FIELD: List({"role": Value("string"),
                                                                          "content": List(item)}),
                       TEXT_FIELD: Value("string"), "image_width": Value("int32"),
                       "image_height": Value("int32")}).arrow_schema
    image = {"bytes": png, "path": None}

    def write(copies: int) -> list[int]:
        chars: list[int] = []
        # Every row holds the same PNG `copies` times; dictionary encoding stores it once per row group.
        with pq.ParquetWriter(tmp, schema, compression="zstd", use_dictionary=True) as writer:
            for start in range(0, n, 256):
                rows = range(start, min(n, start + 256))
                texts, chats = [], []
                for i in rows:
                    rng = random.Random(f"sbench:{spec.dataset_id}:{seed}:{i}")
                    response = _chars_text(rng, pool, 512)
                    texts.append(_entry(IMAGE_TOKEN * copies + "\n" + VISION_PROMPT, response))
                    chats.append(vision_messages(copies, response))
                chars.extend(len(t) for t in texts)
                writer.write_table(pa.table({
                    IMAGE_FIELD: [[image] * copies for _ in rows], MESSAGES_FIELD: chats, TEXT_FIELD: texts,
                    "image_width": [spec.width] * len(rows), "image_height": [spec.height] * len(rows)},
                    schema=schema))
        return chars

    chars = write(copies)
    sha, size = file_sha256(tmp), tmp.stat().st_size
    if processor is not None:
        name = str(processor_source) if isinstance(processor_source, (str, os.PathLike)) else type(processor).__name__
        counted = vision_token_counts(processor, tmp, dataset_sha=sha)
        low = min(counted.counts)
        if low < spec.min_tokens:  # an entry whose text is shorter than the probe's: as many more copies as it lacks
            copies += -(-(spec.min_tokens - low) // per_image)
            chars = write(copies)
            sha, size = file_sha256(tmp), tmp.stat().st_size
            counted = vision_token_counts(processor, tmp, dataset_sha=sha)
            low = min(counted.counts)
        stats["chars"].extend(chars)
        stats["tokens"].extend(counted.counts)
        if low < spec.min_tokens:  # pragma: no cover - one more round covers any text-length difference
            raise SbenchError(f"an entry has {low} tokens, below {spec.min_tokens}, with {name}'s processor")
        guarantee = {
            "method": "processor", "min_tokens": spec.min_tokens, "verified": True, "processor": name,
            "copies_per_entry": copies, "tokens_per_image": per_image, "min_tokens_seen": low,
            "image_tokens": sum(counted.image_tokens),
            "detail": (f"{copies} copies x {per_image} image tokens per entry; every entry was counted with the "
                       f"processor of {name} (its chat template on the messages, the images expanded): at least "
                       f"{low} >= {spec.min_tokens} tokens, image tokens included")}
        return sha, size, n, {"guarantee": guarantee, "png_bytes": len(png)}
    stats["chars"].extend(chars)
    guarantee = {
        "method": "image-copies-estimate", "min_tokens": spec.min_tokens, "verified": False,
        "copies_per_entry": copies, "estimated_tokens_per_image": per_image,
        "detail": (f"{copies} copies x {per_image} estimated image tokens = {copies * per_image} >= "
                   f"{spec.min_tokens}; the estimate follows granite-vision-3.2-2b's anyres geometry "
                   "(384px tiles, 27x27 features) and was NOT checked with its processor (give --tokenizer "
                   "MODEL_DIR of a vision-language model to count exactly); text tokens come on top"),
    }
    return sha, size, n, {"guarantee": guarantee, "png_bytes": len(png)}


def _tmp_name(path: Path, what: str) -> Path:
    return path.with_name(f".{path.name}.{what}-{socket.gethostname()}-{os.getpid()}")


def _remove_stale_temps(path: Path) -> None:
    """Leftovers of a generator that crashed; only called while holding the lock."""
    for stale in path.parent.glob(f".{_glob_escape(path.name)}.tmp-*"):
        with contextlib.suppress(OSError):
            stale.unlink()


def _glob_escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)


def _publish(path: Path, tmp_data: Path, meta: dict[str, Any]) -> None:
    """Make a finished file visible so that no moment looks complete but is not.

    Order: drop the old data file, publish the new sidecar, then rename the data into place.
    A crash between steps leaves either no data file or a sidecar with no data: both read as
    incomplete and are regenerated. A data file is never visible before its own sidecar.
    """
    tmp_meta = _tmp_name(path, "tmp-meta")
    tmp_meta.write_text(json.dumps(meta, indent=2) + "\n")
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    os.replace(tmp_meta, sidecar_path(path))
    os.replace(tmp_data, path)


# -- public API ---------------------------------------------------------------------------------------------
def generate_dataset(dataset_id: str, out_path: str | os.PathLike[str], *, tokenizer: Any = None,
                     entries: int | None = None, seed: int = 0) -> DatasetInfo:
    """Generate ``dataset_id`` into ``out_path`` (and its ``.meta.json``), replacing what is there.

    ``tokenizer`` (an HF id, a local directory or a tokenizer object) makes every entry of a
    ``news-tokens-*`` id be checked with it, and any short entry extended until it passes.
    ``entries`` overrides the count in the id (for tests).
    """
    spec = parse_dataset_id(dataset_id)
    if entries is not None and (isinstance(entries, bool) or not isinstance(entries, int) or entries < 1):
        raise InputError(f"entries must be a positive integer, got {entries!r}")
    path = _checked_path(spec, out_path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot create directory {path.parent}: {exc.strerror}") from exc
    with locked(path):
        return _generate_locked(spec, path, tokenizer=tokenizer, entries=entries, seed=seed)


def _checked_path(spec: DatasetSpec, path: str | os.PathLike[str]) -> Path:
    p = Path(path)
    if p.is_dir():
        raise InputError(f"{p} is a directory; give a file path such as {p / spec.filename}")
    if p.suffix != f".{spec.fmt}":
        # The token counter and the trainer pick the reader by suffix.
        raise InputError(f"{p}: {spec.dataset_id} is written as {spec.fmt}; name the file *.{spec.fmt} "
                         f"(e.g. {p.with_name(spec.filename)})")
    return p


def _generate_locked(spec: DatasetSpec, path: Path, *, tokenizer: Any, entries: int | None,
                     seed: int) -> DatasetInfo:
    t0 = time.monotonic()
    _remove_stale_temps(path)
    tok_name, lengths = None, None
    if tokenizer is not None and spec.kind == "vision":
        tok_name = f"processor of {tokenizer}"  # counted with the model's processor (_write_parquet)
    elif tokenizer is not None:
        tok = load_tokenizer(tokenizer)
        tok_name, lengths = tokenizer_name(tokenizer, tok), _TokenLengths(tok)
    n = entries if entries is not None else spec.entries
    stats: dict[str, list[int]] = {"chars": [], "tokens": []}
    tmp = _tmp_name(path, "tmp-data")
    extra: dict[str, Any] = {}
    try:
        if spec.kind == "vision":
            sha, size, n, vis = _write_parquet(tmp, spec, n, seed, stats, tokenizer)
            guarantee = vis.pop("guarantee")
            extra.update(vis)
            fsync(tmp)
        else:
            with open(tmp, "wb") as f:
                sha, size, n = _write_jsonl(f, _text_entries(spec, n, seed, lengths, stats))
                f.flush()
                os.fsync(f.fileno())
            guarantee = _text_guarantee(spec, lengths is not None, tok_name, stats["tokens"])
        tokens = _stats(stats["tokens"]) if stats["tokens"] else None
        meta = {"dataset_id": spec.dataset_id, "format": spec.fmt, "entries": n, "seed": seed,
                "generator": "sbench.datagen", "generator_version": GENERATOR_VERSION, "sha256": sha,
                "size_bytes": size, "text_field": TEXT_FIELD, "response_template": RESPONSE_TEMPLATE,
                "chars": _stats(stats["chars"]), "tokens": tokens, "tokenizer": tok_name,
                "length_guarantee": guarantee, "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **extra}
        _publish(path, tmp, meta)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return DatasetInfo(dataset_id=spec.dataset_id, path=path, format=spec.fmt, entries=n, seed=seed,
                       generator_version=GENERATOR_VERSION, sha256=sha, size_bytes=size, chars=meta["chars"],
                       length_guarantee=guarantee, tokens=tokens, tokenizer=tok_name,
                       elapsed_s=round(time.monotonic() - t0, 3), extra=extra)


def _text_guarantee(spec: DatasetSpec, checked: bool, tok_name: str | None, toks: list[int]) -> dict[str, Any]:
    if spec.kind == "chars":
        return {"method": "exact-chars", "input_chars": spec.chars, "response_chars": spec.chars,
                "scaffold_chars": SCAFFOLD_CHARS, "verified": True,
                "detail": f"input and response are exactly {spec.chars} characters each, scaffolding "
                          f"{SCAFFOLD_CHARS}: {2 * spec.chars + SCAFFOLD_CHARS} per entry"}
    detail = (f"every response has >= {spec.min_tokens} whitespace-separated words; a tokenizer that "
              "splits on whitespace before BPE/SentencePiece (GPT-2 byte-level, Llama, Granite, ...) "
              "gives each word at least one token")
    words = {"method": "words", "min_tokens": spec.min_tokens, "min_response_words": spec.min_tokens,
             "detail": detail}
    if not checked:
        return {**words, "verified": False}
    return {**words, "method": "words+tokenizer", "verified": True, "tokenizer": tok_name,
            "min_tokens_seen": min(toks) if toks else None,
            "detail": detail + f"; every entry was then tokenized with {tok_name} (no special tokens) "
                      f"and extended until it had >= {spec.min_tokens} tokens"}


def dataset_status(dataset_id: str, path: str | os.PathLike[str], *, seed: int = 0) -> str:
    """``complete`` | ``external`` (a file with no sidecar: not ours, used as is) | ``missing`` | ``stale``."""
    spec = parse_dataset_id(dataset_id)
    p = Path(path)
    meta = read_meta(p)
    try:
        size = p.stat().st_size
    except FileNotFoundError:
        return "missing"
    if meta is None:
        return "external"
    ok = (meta.get("dataset_id") == spec.dataset_id and meta.get("entries") == spec.entries
          and meta.get("seed") == seed and meta.get("generator_version") == GENERATOR_VERSION
          and meta.get("size_bytes") == size)
    return "complete" if ok else "stale"


def ensure_dataset(dataset_id: str, path: str | os.PathLike[str], *, tokenizer: Any = None, seed: int = 0) -> Path:
    """Return ``path`` once it holds the complete dataset, generating it if needed.

    Safe to call from many processes and nodes at once on a shared filesystem: the first
    generates under ``<path>.lock`` into a temporary file and renames it into place; the
    others wait for the lock and then find the file complete. A file without a sidecar was
    not made by sbench (e.g. a copy of the reference data) and is returned untouched.
    """
    return make_dataset(dataset_id, path, tokenizer=tokenizer, seed=seed)[0]


def make_dataset(dataset_id: str, path: str | os.PathLike[str], *, tokenizer: Any = None,
                 seed: int = 0) -> tuple[Path, bool]:
    """``ensure_dataset``, also saying whether this call generated the file (False: it was there, or
    another process made it while this one waited for the lock)."""
    p = _checked_path(parse_dataset_id(dataset_id), path)
    if dataset_status(dataset_id, p, seed=seed) in ("complete", "external"):
        return p, False
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SbenchError(f"cannot create dataset directory {p.parent}: {exc.strerror}") from exc
    with locked(p):
        # Another process may have finished it while we waited for the lock.
        if dataset_status(dataset_id, p, seed=seed) in ("complete", "external"):
            return p, False
        _generate_locked(parse_dataset_id(dataset_id), p, tokenizer=tokenizer, entries=None, seed=seed)
    return p, True
