"""Exact dataset token counts, and the pre-tokenized training set that matches them.

The reference defines the tokens a run processed from its dataset as, per entry,
``min(len(tokens(entry["output"])), tokenizer.model_max_length, max_seq_length)``.
``dataset_token_counts`` computes exactly that (cached per tokenizer + dataset + length),
and ``encode_for_training`` produces the ``input_ids`` the trainer consumes with the very
same tokenizer call, so ``len(input_ids[i]) == counts[i]`` by construction: what the run
reports is what it trained on.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import math
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from hashlib import sha256
from pathlib import Path
from typing import Any

from harness.contract.errors import InputError, SbenchError
from harness.contract.formats import TEXT_FIELD

from .files import file_sha256

COUNT_VERSION = 1  # bump when the counting rule changes: old cache entries then miss
_BATCH = 512  # texts per tokenizer call at most
_BATCH_CHARS = 4 << 20  # ... or about this many characters
# Fixed texts whose ids enter the tokenizer fingerprint: they catch behaviour (special tokens,
# normalisation, whitespace and unicode handling) that settings outside the vocabulary change.
_PROBES = (
    "Probe: The council approved the $12 million budget on Monday.\n### Response:\n  ÄÖ 中文 123",
    "  leading, trailing   and  repeated spaces  ", "Tabs\tand\nnewlines\r\nand\n\n\nblank lines",
    "CamelCase snake_case kebab-case 3.14159 1,000,000 2026-11-23 ALL CAPS", "Ünïcödé façade naïve — “quotes” …",
    "日本語 한국어 العربية עברית Ελληνικά русский", "def f(x):\n    return x ** 2  # code\n",
    "<s> literal </s> <unk> <pad> <|endoftext|> [CLS]", "emoji 🙂🚀 and\u200bzero width",
)


# -- tokenizers ---------------------------------------------------------------------------------------------
def load_tokenizer(tokenizer: Any) -> Any:
    """A tokenizer object from an object (returned as is), an HF id or a local directory."""
    if not isinstance(tokenizer, (str, os.PathLike)):
        if not callable(tokenizer):
            raise InputError(f"tokenizer must be an HF id, a directory or a tokenizer object, got {tokenizer!r}")
        return tokenizer
    from transformers import AutoTokenizer  # heavy: only where a model is built or trained

    text = str(tokenizer)
    local = Path(text).expanduser()
    # An HF id has at most one slash; anything that looks like a path must exist, or the hub
    # lookup that follows would report a confusing "repo id" error instead.
    looks_like_path = isinstance(tokenizer, os.PathLike) or text.startswith((".", "/", "~")) or text.count("/") > 1
    if looks_like_path and not local.exists():
        raise InputError(f"tokenizer directory {text} does not exist; give a model directory (e.g. from "
                         "'sbench model tiny -o DIR') or an HF id")
    try:
        return AutoTokenizer.from_pretrained(str(local) if local.exists() else text)
    except Exception as exc:  # transformers raises OSError, ValueError, HF hub errors...
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0].rstrip(".")
        offline = " (HF_HUB_OFFLINE=1: only local directories and cached ids work)" if os.environ.get(
            "HF_HUB_OFFLINE") == "1" else ""
        raise InputError(f"cannot load tokenizer {str(tokenizer)!r}: {first}. Give a directory with tokenizer "
                         f"files (tokenizer.json / tokenizer_config.json) or an available HF id{offline}") from exc


def tokenizer_name(spec: Any, tokenizer: Any) -> str:
    """How to name a tokenizer in messages and metadata: the id/path it came from."""
    if isinstance(spec, (str, os.PathLike)):
        return str(spec)
    return str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__)


def effective_max_length(tokenizer: Any, max_seq_length: int) -> int:
    """``min(tokenizer.model_max_length, max_seq_length)``.

    ``model_max_length`` is a huge sentinel (``int(1e30)``) for tokenizers that do not
    declare one, sometimes a float or None; those leave ``max_seq_length`` in charge.
    """
    if isinstance(max_seq_length, bool) or not isinstance(max_seq_length, int) or max_seq_length < 1:
        raise InputError(f"max_seq_length must be a positive integer, got {max_seq_length!r}")
    mml = getattr(tokenizer, "model_max_length", None)
    if isinstance(mml, (int, float)) and not isinstance(mml, bool) and math.isfinite(mml) and mml >= 1:
        return min(max_seq_length, int(mml))
    return max_seq_length


def _digest(value: Any) -> str:
    return sha256(json.dumps(value, default=str).encode()).hexdigest()


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """sha256 over what decides token ids, and nothing a library version changes on its own.

    The vocabulary, the merges (as "a b" strings: tokenizers 0.20 began writing them as pairs),
    the added tokens, the truncation side, and the ids of probe texts (with special tokens) that
    exercise normalisation, pre-tokenisation and the post-processor. Not which token serves as
    padding: the trainer sets ``pad_token = eos_token`` where a model has none, after preparation
    and without changing a single id of an unpadded encoding. Not the
    tokenizer's class name or its serialized JSON as a whole: transformers 5 renamed the classes
    and tokenizers adds fields (``ignore_merges``, ``byte_fallback``) across versions, and a login
    node and the compute nodes with different versions must still agree on a prepared dataset.
    """
    parts: dict[str, Any] = {}
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        state = json.loads(backend.to_str())
        model = state.get("model") or {}
        vocab = model.get("vocab")
        parts["model"] = model.get("type")
        parts["vocab"] = _digest(sorted(vocab.items()) if isinstance(vocab, dict) else vocab)
        parts["merges"] = _digest([m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []])
        parts["added"] = sorted((t.get("id"), t.get("content"), bool(t.get("special")))
                                for t in state.get("added_tokens") or [])
    else:
        parts["vocab"] = _digest(sorted(tokenizer.get_vocab().items()))
    parts["truncation_side"] = getattr(tokenizer, "truncation_side", None)
    parts["probes"] = [list(tokenizer(p)["input_ids"]) for p in _PROBES]
    return _digest(parts)


class _Encoder:
    """The one tokenizer call behind both counting and encoding.

    Special tokens on (as the trainer would add them), truncation at the effective max
    length on the tokenizer's ``truncation_side``, no padding. Fast tokenizers go through a
    private copy of their Rust backend: batch encoding without per-token Python objects, and
    no interference with the caller's tokenizer state.

    Truncation keeps the first ``max_length`` tokens, yet a tokenizer reads the whole text
    before it truncates: a 100 kB entry cut at 4096 tokens costs ten times the tokens it
    keeps. So a long text is encoded from a prefix ending at a whitespace, long enough
    that at least ``_MARGIN`` more tokens follow the ones kept. Tokens that far from the
    cut cannot depend on it for tokenizers that split words first (byte-level BPE,
    SentencePiece with Metaspace, WordPiece). This is checked, not assumed: the first
    shortened texts of every encoder are also encoded whole, and any difference turns
    the shortcut off for good (``prefix_disabled`` says why).
    """

    _MARGIN = 64  # tokens that must follow the kept ones in a prefix
    _CHECKS = 4  # shortened texts compared with their whole encoding

    def __init__(self, tokenizer: Any, max_length: int) -> None:
        self.tokenizer, self.max_length = tokenizer, max_length
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self.backend = None
        self.prefix_disabled: str | None = None
        self.checks_left = self._CHECKS
        self.chars_per_token = 8.0  # upper estimate, raised when a prefix comes up short
        self.shortened = 0  # texts encoded from a prefix (observability for tests and benchmarks)
        if backend is not None:
            from tokenizers import Tokenizer  # heavy: only where text is tokenized

            self.backend = Tokenizer.from_str(backend.to_str())
            self.backend.no_padding()
            side = getattr(tokenizer, "truncation_side", "right") or "right"
            try:
                self.backend.enable_truncation(max_length, stride=0, strategy="longest_first", direction=side)
            except Exception as exc:
                raise InputError(f"cannot truncate to {max_length} tokens with this tokenizer: {exc}") from exc
            if side != "right":
                self.prefix_disabled = f"truncation_side is {side}"
            self.specials = len(self.backend.encode("", add_special_tokens=True).ids)

    # -- the prefix shortcut ---------------------------------------------------------------------------
    def _cut(self, text: str) -> int:
        """Where to cut ``text`` (its length when it is not worth cutting)."""
        want = int((self.max_length + 2 * self._MARGIN) * self.chars_per_token) + 256
        if self.prefix_disabled or len(text) <= want * 2:
            return len(text)
        ws = max(text.rfind(" ", want - 256, want), text.rfind("\n", want - 256, want))
        return ws if ws > 0 else len(text)

    def _overflow(self, e: Any) -> int:
        return sum(max(0, len(o) - self.specials) for o in e.overflowing)

    def _run(self, texts: list[str], call: Any) -> list[Any]:
        """Encode ``texts`` with ``call`` (a batch method of the backend), shortening long ones."""
        cuts = [self._cut(t) for t in texts]
        out = call([t[:c] for t, c in zip(texts, cuts)])
        over = [self._overflow(e) if c < len(t) else 0 for t, c, e in zip(texts, cuts, out)]
        ratios = [c / (len(e) + o) for t, c, e, o in zip(texts, cuts, out, over) if c < len(t) and o >= self._MARGIN]
        redo = [i for i, (t, c, o) in enumerate(zip(texts, cuts, over)) if c < len(t) and o < self._MARGIN]
        if redo:  # a prefix too short for this tokenizer's chars per token: raise the estimate, encode whole
            self.chars_per_token *= 2
            for i, e in zip(redo, call([texts[i] for i in redo])):
                out[i], cuts[i] = e, len(texts[i])
        elif ratios:  # tighten the estimate to what this tokenizer shows, with room to spare
            self.chars_per_token = min(self.chars_per_token, 1.25 * max(ratios))
        self.shortened += sum(1 for t, c in zip(texts, cuts) if c < len(t))
        if self.checks_left > 0:
            short = [i for i, (t, c) in enumerate(zip(texts, cuts)) if c < len(t)][:self.checks_left]
            if short:
                self.checks_left -= len(short)
                whole = call([texts[i] for i in short])
                if any(w.ids != out[i].ids for i, w in zip(short, whole)):
                    self.prefix_disabled = "a shortened text encoded differently from the whole text"
                    return call(texts)
        return out

    def lengths(self, texts: list[str]) -> list[int]:
        if self.backend is not None:
            try:
                enc = self._run(texts, lambda b: self.backend.encode_batch_fast(b, add_special_tokens=True))
            except Exception as exc:  # e.g. max length shorter than the special tokens it must keep
                raise InputError(f"tokenizing at max length {self.max_length} failed: {exc}") from exc
            return [len(e) for e in enc]
        enc = self.tokenizer(texts, add_special_tokens=True, truncation=True, max_length=self.max_length,
                             padding=False, return_attention_mask=False)
        return [len(ids) for ids in enc["input_ids"]]

    def encode(self, texts: list[str]) -> list[tuple[list[int], list[tuple[int, int]]]]:
        if self.backend is None:
            raise InputError(f"{tokenizer_name(None, self.tokenizer)} is a slow (Python) tokenizer; the completion "
                             "mask needs a fast tokenizer's offset mapping (tokenizer.json)")
        try:
            enc = self._run(texts, lambda b: self.backend.encode_batch(b, add_special_tokens=True))
        except Exception as exc:
            raise InputError(f"tokenizing at max length {self.max_length} failed: {exc}") from exc
        return [(e.ids, e.offsets) for e in enc]


# -- datasets -----------------------------------------------------------------------------------------------
def _iter_texts(path: Path, text_field: str) -> Iterator[str]:
    """The ``text_field`` of every entry of a JSONL or Parquet file, in order."""
    if not path.is_file():
        raise InputError(f"dataset file {path} does not exist; generate it with: sbench dataset generate ID -o {path}")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq  # heavy: only where Arrow or Parquet data is read or written

        pf = pq.ParquetFile(path)
        if text_field not in pf.schema_arrow.names:
            raise InputError(f"{path}: no column {text_field!r} (columns: {', '.join(pf.schema_arrow.names)}); "
                             "pass the right --text-field")
        for batch in pf.iter_batches(columns=[text_field], batch_size=256):
            for value in batch.column(0).to_pylist():
                yield value or ""
        return
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError as exc:
                raise InputError(f"{path}:{lineno}: not a JSON object ({exc}); datasets are JSONL, one object "
                                 "a line") from None
            value = obj.get(text_field) if isinstance(obj, dict) else None
            if not isinstance(value, str):
                keys = ", ".join(obj) if isinstance(obj, dict) else type(obj).__name__
                raise InputError(f"{path}:{lineno}: no string field {text_field!r} (has: {keys}); pass the right "
                                 "--text-field")
            yield value


def _batches(texts: Iterator[str], size: int = _BATCH, chars: int = _BATCH_CHARS) -> Iterator[list[str]]:
    """Batches of at most ``size`` texts or about ``chars`` characters: big enough to keep every core busy."""
    batch: list[str] = []
    n = 0
    for t in texts:
        batch.append(t)
        n += len(t)
        if len(batch) == size or n >= chars:
            yield batch
            batch, n = [], 0
    if batch:
        yield batch


@dataclass
class TokenCounts:
    """Per-entry token counts of a dataset under one tokenizer and max length."""

    counts: list[int]
    total: int
    entries: int
    cache: str  # "hit" | "miss" | "off"
    key: str
    max_length: int  # the effective max length the counts were truncated at
    elapsed_s: float = 0.0

    def summary(self) -> dict[str, Any]:
        """What a run records: ``{"total", "entries", "cache", "key", "max_length"}``."""
        return {"total": self.total, "entries": self.entries, "cache": self.cache, "key": self.key,
                "max_length": self.max_length}


def _cache_key(fingerprint: str, dataset_sha: str, max_length: int, text_field: str) -> str:
    doc = {"v": COUNT_VERSION, "tokenizer": fingerprint, "dataset_sha256": dataset_sha, "max_length": max_length,
           "text_field": text_field}
    return sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def _read_cache(file: Path, key: str) -> list[int] | None:
    try:
        doc = json.loads(file.read_text())
    except (OSError, ValueError):
        return None  # missing or half-written by a crashed writer from before atomic writes: recount
    counts = doc.get("counts")
    if (doc.get("key") != key or not isinstance(counts, list) or len(counts) != doc.get("entries")
            or sum(counts) != doc.get("total")):
        return None
    return counts


def _write_cache(file: Path, doc: dict[str, Any]) -> None:
    tmp = file.with_name(f".{file.name}.tmp-{os.getpid()}")
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, file)  # atomic: a concurrent reader sees the old file or the whole new one
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise SbenchError(f"cannot write token-count cache {file}: {exc.strerror}") from exc


def counts_file(cache_dir: str | os.PathLike[str] | None, key: str) -> Path | None:
    return Path(cache_dir) / f"tokens-{key}.json" if cache_dir is not None else None


def _store_counts(file: Path, key: str, counts: list[int], max_length: int, text_field: str, path: Path,
                  tokenizer: str) -> None:
    _write_cache(file, {"key": key, "version": COUNT_VERSION, "entries": len(counts), "total": sum(counts),
                        "max_length": max_length, "text_field": text_field, "dataset": str(path),
                        "tokenizer": tokenizer, "counts": counts})


def dataset_token_counts(tokenizer: Any, dataset_path: str | os.PathLike[str], *, text_field: str = TEXT_FIELD,
                         max_seq_length: int, cache_dir: str | os.PathLike[str] | None = None,
                         dataset_sha: str | None = None) -> TokenCounts:
    """Exact per-entry counts ``min(len(tokens(text)), model_max_length, max_seq_length)``.

    ``tokenizer`` is an object, an HF id or a directory. With ``cache_dir`` the counts are
    stored under a key over the tokenizer fingerprint, the dataset's sha256, the effective
    max length and the text field, so any change to one of them recounts. ``dataset_sha`` is the
    file's sha256 when the caller has just computed it.
    """
    t0 = time.monotonic()
    tok = load_tokenizer(tokenizer)
    path = Path(dataset_path)
    eff = effective_max_length(tok, max_seq_length)
    if not path.is_file():
        raise InputError(f"dataset file {path} does not exist; generate it with: sbench dataset generate ID -o {path}")
    key = _cache_key(tokenizer_fingerprint(tok), dataset_sha or file_sha256(path), eff, text_field)
    cache_file = counts_file(cache_dir, key)
    if cache_file is not None and (cached := _read_cache(cache_file, key)) is not None:
        return TokenCounts(counts=cached, total=sum(cached), entries=len(cached), cache="hit", key=key,
                           max_length=eff, elapsed_s=round(time.monotonic() - t0, 3))
    encoder = _Encoder(tok, eff)
    counts: list[int] = []
    for batch in _batches(_iter_texts(path, text_field)):
        counts.extend(encoder.lengths(batch))
    if cache_file is not None:
        _store_counts(cache_file, key, counts, eff, text_field, path, tokenizer_name(tokenizer, tok))
    return TokenCounts(counts=counts, total=sum(counts), entries=len(counts),
                       cache="miss" if cache_file is not None else "off", key=key, max_length=eff,
                       elapsed_s=round(time.monotonic() - t0, 3))


# -- training data ------------------------------------------------------------------------------------------
_ESCAPE = re.compile(r"\\(u[0-9a-fA-F]{4}|x[0-9a-fA-F]{2}|[ntr0\\'\"])")
_SIMPLE = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "\\": "\\", "'": "'", '"': '"'}


def decode_template(s: str) -> str:
    r"""Turn the escapes a shell passes through literally (``\n``, ``\t``, ``\xNN``, ``\uNNNN``) into characters.

    ``"\\n### Response:"`` (backslash, n) becomes ``"\n### Response:"``. Unknown escapes
    stay as written, and text without a backslash is returned unchanged (so decoding twice
    is harmless).
    """
    def sub(m: re.Match[str]) -> str:
        e = m.group(1)
        return chr(int(e[1:], 16)) if e[0] in "ux" else _SIMPLE[e]

    return _ESCAPE.sub(sub, s)


def completion_mask(text: str, offsets: list[tuple[int, int]], start: int) -> list[int]:
    """1 for tokens that begin at or after character ``start``, else 0.

    A token straddling ``start`` belongs to the prompt. Special tokens carry the offset
    (0, 0): one before the completion (BOS) is prompt, one after it (EOS) is completion.
    """
    mask, seen = [], False
    for s, e in offsets:
        special = s == e == 0
        inside = (seen and special) or (not special and s >= start)
        seen = seen or inside
        mask.append(1 if inside else 0)
    return mask


def _completion_start(offsets: list[tuple[int, int]], start: int) -> int | None:
    """The index from which ``completion_mask`` is all ones, found by bisection; None when offsets
    do not rise monotonically (then the linear ``completion_mask`` decides)."""
    n = len(offsets)
    while n and offsets[n - 1] == (0, 0):  # trailing special tokens (EOS) follow whatever precedes them
        n -= 1
    k = bisect.bisect_left(offsets, start, 0, n, key=lambda o: o[0])
    # Bisection is only right on rising starts; check the neighbourhood it relies on.
    if (k > 0 and offsets[k - 1][0] >= start) or (k < n and offsets[k][0] < start):
        return None
    return k if k < n else len(offsets)  # no completion token: trailing specials stay prompt too


ENCODED_COLUMNS = ("input_ids", "completion_mask")


def encoded_schema() -> Any:
    """The Arrow schema of the training data: token ids (int32) and the completion mask (int8)."""
    import pyarrow as pa  # heavy: only where Arrow or Parquet data is read or written

    return pa.schema([("input_ids", pa.list_(pa.int32())), ("completion_mask", pa.list_(pa.int8()))])


def encoded_batches(tok: Any, dataset_path: str | os.PathLike[str], *, text_field: str, max_length: int,
                    template: str, lengths: list[int]) -> Iterator[Any]:
    """Arrow record batches of ``input_ids`` and ``completion_mask``; appends each row's length to ``lengths``.

    ``tok`` is a tokenizer object, ``max_length`` the effective max length and ``template`` the
    decoded response template.
    """
    import pyarrow as pa  # heavy: only where Arrow or Parquet data is read or written

    path = Path(dataset_path)
    encoder = _Encoder(tok, max_length)
    schema = encoded_schema()
    ids_type, mask_type = schema.field("input_ids").type, schema.field("completion_mask").type
    row = 0
    for texts in _batches(_iter_texts(path, text_field)):
        ids_col, mask_col = [], []
        for text, (ids, offsets) in zip(texts, encoder.encode(texts)):
            pos = text.find(template)
            if pos < 0:
                raise InputError(f"{path}: entry {row} has no response template {template!r}; check "
                                 "--response_template (escapes like \\n are decoded) and --text-field")
            ids_col.append(ids)
            lengths.append(len(ids))
            k = _completion_start(offsets, pos + len(template)) if offsets else None
            mask_col.append([0] * k + [1] * (len(ids) - k) if k is not None
                            else completion_mask(text, offsets, pos + len(template)))
            row += 1
        # Arrow arrays per batch: ~5 bytes a token instead of Python ints for the whole dataset.
        yield pa.record_batch([pa.array(ids_col, ids_type), pa.array(mask_col, mask_type)], schema=schema)


def checked_template(response_template: str) -> str:
    template = decode_template(response_template)
    if not template:
        raise InputError("response_template is empty; the reference uses '\\n### Response:'")
    return template


def store_counts(tok: Any, tokenizer: Any, path: Path, cache_dir: str | os.PathLike[str], lengths: list[int],
                 max_length: int, text_field: str, dataset_sha: str | None = None) -> None:
    """Record ``lengths`` as ``dataset_token_counts``'s cache entry for this tokenizer, dataset and length."""
    key = _cache_key(tokenizer_fingerprint(tok), dataset_sha or file_sha256(path), max_length, text_field)
    _store_counts(counts_file(cache_dir, key), key, lengths, max_length, text_field, path,  # type: ignore[arg-type]
                  tokenizer_name(tokenizer, tok))


def encode_for_training(tokenizer: Any, dataset_path: str | os.PathLike[str], *, text_field: str = TEXT_FIELD,
                        max_seq_length: int, response_template: str,
                        cache_dir: str | os.PathLike[str] | None = None) -> Any:
    """A ``datasets.Dataset`` with ``input_ids`` and ``completion_mask`` (1 = response token), in memory.

    Rows are truncated exactly like ``dataset_token_counts`` counts them. The response starts
    right after the first occurrence of the (decoded) ``response_template`` in each text.
    With ``cache_dir`` the row lengths are also stored as ``dataset_token_counts``'s cache
    entry, so counting after encoding is a hit instead of a second pass over the dataset.
    (Jobs use :mod:`harness.data.prepared`, which writes the same batches to a shared,
    memory-mapped file instead.)
    """
    import pyarrow as pa  # heavy: only where Arrow or Parquet data is read or written
    from datasets import Dataset  # heavy: only where a dataset is opened
    from datasets.table import InMemoryTable  # heavy: only where a dataset is opened

    tok = load_tokenizer(tokenizer)
    template = checked_template(response_template)
    path = Path(dataset_path)
    eff = effective_max_length(tok, max_seq_length)
    lengths: list[int] = []
    batches = list(encoded_batches(tok, path, text_field=text_field, max_length=eff, template=template,
                                   lengths=lengths))
    if cache_dir is not None:
        store_counts(tok, tokenizer, path, cache_dir, lengths, eff, text_field)
    return Dataset(InMemoryTable(pa.Table.from_batches(batches, schema=encoded_schema())))
