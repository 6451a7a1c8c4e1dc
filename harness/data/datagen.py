"""Synthetic benchmark datasets, generated locally and deterministically.

The reference experiments name their datasets by id (``news-chars-512-entries-4096``,
``news-tokens-16384plus-entries-4096``, ...). sbench makes each one from a seed instead of
downloading it, so every node of every cluster trains on byte-identical data:

* text ids -> JSONL, one ``{"output": ...}`` object per line, each entry in the form
  ``<instruction>### Input:\\n<input>\\n\\n### Response:\\n<response>`` (the trainer runs with
  ``--dataset_text_field output --response_template "\\n### Response:"``);
* vision ids -> Parquet with an ``images`` column (the same synthetic PNG, repeated) and the
  same ``output`` text column (``visiongen``, with the picture of ``png``).

The prose of both is ``newstext``'s.

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
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from harness.contract.errors import InputError, SbenchError
from harness.contract.formats import RESPONSE_TEMPLATE, TEXT_FIELD
from harness.contract.paths import dataset_filename, dataset_format
from harness.spec.catalog import DATASET_IDS, VISION_ID_RE

from .files import fsync, locked
from .newstext import SCAFFOLD_CHARS, chars_text, entry, sentence_pool, words_text
from .tokens import load_tokenizer, tokenizer_name
from .visiongen import write_vision_parquet

GENERATOR_VERSION = 2  # 2: vision datasets carry their chat messages

# Input of the long (tokens) entries: a short lead, so the response template stays inside
# any sensible max_seq_length and completion-only loss always has tokens to learn from.
TOKENS_LEAD_CHARS = 512


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
    pool, counts = sentence_pool(seed)
    batch = 32 if spec.kind == "tokens" else 256
    for start in range(0, n, batch):
        texts = []
        for i in range(start, min(n, start + batch)):
            # One rng per entry: an entry does not depend on how the ones before it were extended.
            rng = random.Random(f"sbench:{spec.dataset_id}:{seed}:{i}")
            if spec.kind == "chars":
                texts.append(entry(chars_text(rng, pool, spec.chars), chars_text(rng, pool, spec.chars)))
            else:
                # The response alone has >= min_tokens words; _text_guarantee says why that suffices.
                lead = chars_text(rng, pool, TOKENS_LEAD_CHARS)
                texts.append(entry(lead, words_text(rng, pool, counts, spec.min_tokens)))
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
            texts[j] += "\n\n" + words_text(rng, pool, counts, need)
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
        tok_name = f"processor of {tokenizer}"  # counted with the model's processor (visiongen)
    elif tokenizer is not None:
        tok = load_tokenizer(tokenizer)
        tok_name, lengths = tokenizer_name(tokenizer, tok), _TokenLengths(tok)
    n = entries if entries is not None else spec.entries
    stats: dict[str, list[int]] = {"chars": [], "tokens": []}
    tmp = _tmp_name(path, "tmp-data")
    extra: dict[str, Any] = {}
    try:
        if spec.kind == "vision":
            sha, size, n, vis = write_vision_parquet(tmp, spec, n, seed, stats, tokenizer)
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
