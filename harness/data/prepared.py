"""Training data prepared once, shared read-only, memory-mapped by every job.

Tokenizing the reference datasets is most of a cold job's start-up: the 420 MB
``news-tokens-16384plus-entries-4096`` costs minutes per rank. ``ensure_prepared`` does it
once and stores the result under ``<data_dir>/.prepared/encoded/<key>/``:

- ``data.arrow``: an Arrow IPC stream of ``input_ids`` (int32) and ``completion_mask``
  (int8), exactly the rows the trainer consumes; jobs open it as a memory-mapped
  ``datasets.Dataset``, so it costs page-cache reads instead of tokenizer time;
- ``meta.json``: the key's ingredients, rows, tokens, size and sha256 of ``data.arrow``.

The key is content: the tokenizer fingerprint, the dataset file's sha256, the effective max
length, the text field and the collator settings (completion-only loss after the decoded
response template). Change any of them and the key changes, so nothing stale is reused;
the same inputs in another campaign hit the same entry.

Every open checks the entry against its ``meta.json`` (size and sha256 of the data). A
truncated or corrupted entry is moved aside and rebuilt, never trained on. Builders hold
``<key>.lock`` and publish with one ``rename`` of a finished directory, so concurrent
prepares and jobs racing a prepare see either no entry or a whole one. Entries are made
read-only once published.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from hashlib import sha256
from importlib import metadata
from pathlib import Path
from typing import Any

from harness.contract.errors import InputError, SbenchError
from harness.contract.formats import RESPONSE_TEMPLATE_ARG, TEXT_FIELD
from harness.contract.paths import dataset_filename
from harness.spec.modelmap import is_local_source
from harness.spec.sweep import data_dir_for

from .datagen import read_meta
from .files import file_sha256, fsync, locked
from .tokens import (
    COUNT_VERSION,
    checked_template,
    effective_max_length,
    encoded_batches,
    encoded_schema,
    load_tokenizer,
    store_counts,
    tokenizer_fingerprint,
    tokenizer_name,
)

PREP_DIR = ".prepared"  # under the data dir
TOKEN_CACHE_DIR = ".token-counts"  # under the data dir: dataset_token_counts' cache
PREP_VERSION = 1  # bump when the stored rows change meaning: old entries then miss
COLLATOR = "completion_only"  # the reference's response-template collator: loss on the response only
DATA_FILE, META_FILE = "data.arrow", "meta.json"


@dataclass
class Prepared:
    """An entry of the prepared-data cache, opened (``dataset``) or only checked."""

    key: str
    path: Path
    status: str  # hit | built | rebuilt
    rows: int
    tokens: int
    elapsed_s: float
    reason: str | None = None  # why it had to be (re)built
    build_s: float | None = None
    dataset: Any = None
    waited_s: float = 0.0  # time spent waiting for another builder's lock
    doc: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {"key": self.key, "path": str(self.path), "status": self.status, "rows": self.rows,
                "tokens": self.tokens, "elapsed_s": self.elapsed_s, "reason": self.reason, "build_s": self.build_s,
                "waited_s": round(self.waited_s, 3)}


def prep_key(fingerprint: str, dataset_sha: str, max_length: int, text_field: str, template: str) -> tuple[str, dict]:
    """The entry key and the document it hashes (stored in ``meta.json``)."""
    doc = {"v": PREP_VERSION, "count_v": COUNT_VERSION, "tokenizer": fingerprint, "dataset_sha256": dataset_sha,
           "max_length": max_length, "text_field": text_field, "collator": COLLATOR, "response_template": template,
           "packing": False}
    return sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest(), doc


def entry_dir(root: str | os.PathLike[str], key: str) -> Path:
    return Path(root) / "encoded" / key


def check_entry(path: Path, key: str, *, verify: bool = True) -> str | None:
    """None when ``path`` holds the complete entry ``key``; else why not."""
    if not path.is_dir():
        return "not prepared"
    try:
        meta = json.loads((path / META_FILE).read_text())
    except (OSError, ValueError) as exc:
        return f"{META_FILE} unreadable ({exc.__class__.__name__})"
    if not isinstance(meta, dict) or meta.get("key") != key:
        return f"{META_FILE} belongs to another key"
    data = path / DATA_FILE
    try:
        size = data.stat().st_size
    except OSError:
        return f"{DATA_FILE} missing"
    if size != meta.get("size_bytes"):
        return f"{DATA_FILE} has {size} bytes, {META_FILE} says {meta.get('size_bytes')} (truncated?)"
    if verify:
        if file_sha256(data) != meta.get("sha256"):
            return f"{DATA_FILE} does not match its sha256 (corrupted)"
    return None


def open_entry(path: Path) -> Any:
    """The entry as a memory-mapped ``datasets.Dataset``; its schema and row count checked against meta."""
    from datasets import Dataset  # heavy: only where a dataset is opened
    from datasets.table import MemoryMappedTable  # heavy: only where a dataset is opened

    meta = json.loads((path / META_FILE).read_text())
    table = MemoryMappedTable.from_file(str(path / DATA_FILE))
    if table.schema.remove_metadata() != encoded_schema() or table.num_rows != meta.get("rows"):
        raise SbenchError(f"{path}: prepared data has schema {table.schema} and {table.num_rows} rows; "
                          f"expected {encoded_schema()} and {meta.get('rows')}")
    return Dataset(table)


def lengths_and_empty(column: Any) -> tuple[list[int], int]:
    """Per-entry token counts, and how many entries have no completion token (a response that falls beyond
    the max length, or none): their loss is all masked. From a ``completion_mask`` column (Arrow: chunked, or
    one list array), without a Python list per entry."""
    import numpy as np  # heavy: only where arrays are built

    lengths: list[int] = []
    empty = 0
    for chunk in getattr(column, "chunks", [column]):
        rel = chunk.offsets.to_numpy()
        rel = rel - rel[0]
        n = np.diff(rel)
        lengths.extend(n.tolist())
        flat = chunk.flatten().to_numpy(zero_copy_only=False)
        starts = rel[:-1][n > 0]
        has = np.maximum.reduceat(flat, starts) > 0 if len(starts) else np.zeros(0, dtype=bool)
        empty += int((n == 0).sum()) + int((~has).sum())
    return lengths, empty


def _set_read_only(path: Path) -> None:
    for f in path.iterdir():
        f.chmod(0o444)
    path.chmod(0o555)


def _discard(path: Path, why: str) -> None:
    """Move a bad entry out of the way (one rename), then delete it."""
    if not path.exists():
        return
    aside = path.with_name(f".bad-{path.name}-{socket.gethostname()}-{os.getpid()}-{int(time.time())}")
    with contextlib.suppress(OSError):
        path.chmod(0o755)
    try:
        os.replace(path, aside)
    except OSError as exc:
        raise SbenchError(f"cannot move the bad prepared entry {path} aside ({why}): {exc.strerror}") from exc
    for p in [aside, *aside.iterdir()]:
        with contextlib.suppress(OSError):
            p.chmod(0o755 if p.is_dir() else 0o644)
    shutil.rmtree(aside, ignore_errors=True)


def _remove_dead_builds(path: Path) -> None:
    """Temporary directories of builders of this key that died (only called under the key's lock)."""
    for tmp in path.parent.glob(f".tmp-{path.name}-*"):
        with contextlib.suppress(OSError):
            tmp.chmod(0o755)
        shutil.rmtree(tmp, ignore_errors=True)


def publish(path: Path, write: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
    """Build an entry in a temporary directory beside *path* (``write(tmp)`` writes :data:`DATA_FILE` into it and
    returns its ``meta.json`` document, size and sha256 of the data added here), make it read-only and publish it
    with one ``rename``. Call under the key's lock. Returns the meta document."""
    tmp = path.with_name(f".tmp-{path.name}-{socket.gethostname()}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        meta = write(tmp)
        data = tmp / DATA_FILE
        fsync(data)
        meta.update(size_bytes=data.stat().st_size, sha256=file_sha256(data), built_on=socket.gethostname(),
                    created_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        _set_read_only(tmp)
        os.rename(tmp, path)  # atomic: the entry appears whole or not at all
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.chmod(0o755)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return meta


def ensure_entry(root: Path, key: str, *, verify: bool, why_missing: Callable[[], str],
                 write: Callable[[Path], dict[str, Any]]) -> tuple[Path, str, str | None, float | None, float]:
    """The entry *key* under *root*: checked, (re)built with *write* (see :func:`publish`) when missing or bad,
    under its lock so that concurrent builders build it once. Returns (path, status: hit | built | rebuilt, why it
    was built, build seconds, seconds waited for another builder's lock)."""
    path = entry_dir(root, key)
    reason = check_entry(path, key, verify=verify)
    status, build_s, waited = "hit", None, 0.0
    if reason is None:
        return path, status, None, None, waited
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SbenchError(f"cannot create the prepared-data directory {path.parent}: {exc.strerror}") from exc
    tw = time.monotonic()
    with locked(path):
        waited = time.monotonic() - tw
        again = check_entry(path, key, verify=verify)  # another builder may have finished it meanwhile
        if again is None:
            return path, status, None, None, waited
        _remove_dead_builds(path)
        status = "built" if again == "not prepared" else "rebuilt"
        reason = again if again != "not prepared" else why_missing()
        _discard(path, again)
        t0 = time.monotonic()
        meta = publish(path, write)
        build_s = meta.get("build_s", round(time.monotonic() - t0, 3))
    return path, status, reason, build_s, waited


def _write_encoded(tmp: Path, key: str, key_doc: dict[str, Any], tok: Any, tokenizer: Any, dataset_path: Path, *,
                   text_field: str, max_length: int, template: str, lengths: list[int]) -> dict[str, Any]:
    import pyarrow as pa  # heavy: only where Arrow or Parquet data is read or written

    t0 = time.monotonic()
    empty = 0
    with pa.OSFile(str(tmp / DATA_FILE), "wb") as sink, pa.ipc.new_stream(sink, encoded_schema()) as writer:
        for batch in encoded_batches(tok, dataset_path, text_field=text_field, max_length=max_length,
                                     template=template, lengths=lengths):
            writer.write_batch(batch)
            empty += lengths_and_empty(batch.column(1))[1]
    return {"key": key, **key_doc, "rows": len(lengths), "tokens": sum(lengths), "entries_without_completion": empty,
            "dataset": str(dataset_path), "tokenizer_source": tokenizer_name(tokenizer, tok),
            "build_s": round(time.monotonic() - t0, 3)}


_WHY = ("tokenizer", "max_length", "text_field", "response_template")


def _why_missing(root: Path, key_doc: dict[str, Any]) -> str:
    """"not prepared", with a hint when an entry of the same dataset differs in one ingredient only.

    The usual cause is a tokenizer fingerprint that differs between where ``sbench prepare`` ran and
    the node (another tokenizers/transformers version in the nodes' environment).
    """
    for meta_file in (root / "encoded").glob(f"*/{META_FILE}"):
        try:
            meta = json.loads(meta_file.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(meta, dict) or meta.get("dataset_sha256") != key_doc["dataset_sha256"]:
            continue
        diff = [k for k in _WHY if meta.get(k) != key_doc.get(k)]
        if diff == ["tokenizer"]:
            return ("not prepared for this tokenizer fingerprint; an entry for the same dataset and settings was "
                    f"prepared with another one ({meta_file.parent.name[:12]}): is the tokenizers/transformers version "
                    "here the one sbench prepare ran with? (sbench prepare --on slurm prepares with the nodes' "
                    "environment)")
    return "not prepared"


def ensure_prepared(tokenizer: Any, dataset_path: str | os.PathLike[str], *, text_field: str, max_seq_length: int,
                    response_template: str, root: str | os.PathLike[str], token_cache: str | os.PathLike[str] | None,
                    open_dataset: bool = True, verify: bool = True) -> Prepared:
    """The prepared training data of this tokenizer, dataset and length: checked, built when missing or bad.

    ``tokenizer`` is a tokenizer object, an HF id or a directory. ``open_dataset`` returns it
    memory-mapped in ``Prepared.dataset``. Raises ``InputError`` for bad input (no template
    in an entry, a missing dataset) and ``SbenchError`` when the cache cannot be written.
    """
    t0 = time.monotonic()
    tok = load_tokenizer(tokenizer)
    template = checked_template(response_template)
    data_path = Path(dataset_path)
    if not data_path.is_file():
        raise InputError(f"dataset file {data_path} does not exist; generate it with: sbench dataset generate ID "
                         f"-o {data_path}")
    eff = effective_max_length(tok, max_seq_length)
    dataset_sha = file_sha256(data_path)
    key, key_doc = prep_key(tokenizer_fingerprint(tok), dataset_sha, eff, text_field, template)
    lengths: list[int] = []

    def write(tmp: Path) -> dict[str, Any]:
        return _write_encoded(tmp, key, key_doc, tok, tokenizer, data_path, text_field=text_field, max_length=eff,
                              template=template, lengths=lengths)

    path, status, reason, build_s, waited = ensure_entry(
        Path(root), key, verify=verify, why_missing=lambda: _why_missing(Path(root), key_doc), write=write)
    if status != "hit" and token_cache is not None:  # the token-count stage then hits instead of tokenizing again
        with contextlib.suppress(SbenchError):
            store_counts(tok, tokenizer, data_path, Path(token_cache), lengths, eff, text_field, dataset_sha)
    meta = json.loads((path / META_FILE).read_text())
    ds = open_entry(path) if open_dataset else None
    return Prepared(key=key, path=path, status=status, rows=meta["rows"], tokens=meta["tokens"],
                    elapsed_s=round(time.monotonic() - t0, 3), reason=reason, build_s=build_s, dataset=ds,
                    waited_s=waited, doc=meta)


# -- stamps: a re-check that trusts sizes and modification times ----------------------------------------------
# Checking prepared data from scratch loads the tokenizer (its library's import alone takes seconds) and
# hashes the dataset and the entry (hundreds of MB). A stamp, written after a full check, records the size
# and mtime of every input (the dataset file, the model directory's files) and output (the entry's files and
# the token counts), and the libraries' versions; while all of them are unchanged, the entry is ready
# without loading or hashing anything. Any difference falls back to the full check, which writes a new stamp.
# Jobs do not use stamps: every open on a node checks the entry's sha256.
STAMP_DIR = "stamps"  # under the prepared-data root
STAMP_VERSION = 1


def _stat(path: Path) -> list[int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns]


def file_stamps(paths: list[Path]) -> dict[str, list[int] | None]:
    """path -> [size, mtime_ns] (None: missing) of each file, and of each file directly inside a directory."""
    out: dict[str, list[int] | None] = {}
    for p in paths:
        if p.is_dir():
            for f in sorted(p.iterdir()):
                if f.is_file():
                    out[str(f)] = _stat(f)
        else:
            out[str(p)] = _stat(p)
    return out


def _libraries() -> dict[str, str | None]:
    """Versions of the libraries that tokenize (a change re-checks everything; no import needed)."""
    out: dict[str, str | None] = {}
    for name in ("transformers", "tokenizers"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def stamp_path(root: str | os.PathLike[str], ident: dict[str, Any]) -> Path:
    """The stamp of one training input (*ident*: what names it, e.g. model, dataset, length, field, template)."""
    digest = sha256(json.dumps({"v": STAMP_VERSION, "prep_v": PREP_VERSION, "count_v": COUNT_VERSION, **ident},
                               sort_keys=True).encode()).hexdigest()
    return Path(root) / STAMP_DIR / f"{digest[:32]}.json"


def read_stamp(root: str | os.PathLike[str], ident: dict[str, Any],
               inputs: list[Path]) -> tuple[dict[str, Any] | None, str]:
    """(the stamped result, "unchanged") when every input and output is as stamped; else (None, what changed)."""
    try:
        doc = json.loads(stamp_path(root, ident).read_text())
    except (OSError, ValueError):
        return None, "no stamp yet"
    if not isinstance(doc, dict) or doc.get("ident") != json.loads(json.dumps(ident)):
        return None, "no stamp yet"
    if doc.get("libraries") != _libraries():
        return None, "the tokenizer libraries changed"
    now = file_stamps(inputs)
    was = doc.get("inputs") or {}
    changed = sorted(set(now) ^ set(was)) + sorted(p for p in now if p in was and now[p] != was[p])
    if changed:
        return None, f"{changed[0]} changed (size or mtime)" + (f", and {len(changed) - 1} more" if len(changed) > 1
                                                                 else "")
    outputs = doc.get("outputs") or {}
    if not outputs or file_stamps([Path(p) for p in outputs]) != outputs:
        return None, "the prepared entry or its token counts changed"
    return doc.get("result") or {}, "unchanged"


def write_stamp(root: str | os.PathLike[str], ident: dict[str, Any], inputs: list[Path], outputs: list[Path],
                result: dict[str, Any]) -> None:
    """Record a full check's result with the sizes and mtimes it was made from (atomic; best effort: a data
    dir that cannot take it only costs the next check its speed)."""
    path = stamp_path(root, ident)
    doc = {"ident": ident, "libraries": _libraries(), "inputs": file_stamps(inputs),
           "outputs": file_stamps(outputs), "result": result, "stamped_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    tmp = path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()


# -- what plan can tell before a job runs ----------------------------------------------------------------------
def _tokenizer_sources(source: str) -> tuple[set[str], str | None]:
    """How a prepared entry names the tokenizer of model *source* (``tokenizer_source`` in its meta.json):
    the source as the jobs pass it, its local path, and for an HF id the shared cache's snapshot directories."""
    if is_local_source(source):
        p = Path(source).expanduser()
        return {source, str(p), str(p.resolve())}, None
    return {source}, f"/models--{source.replace('/', '--')}/snapshots/"


def masked_entries(data_dir: Path, dataset_path: Path, source: str, max_length: int, text_field: str,
                   template: str) -> tuple[int, int, Path] | None:
    """``(entries without a response token, entries, entry dir)`` of the prepared data of this dataset, model,
    max length, text field and (decoded) response template, when it is on this machine; None when it is not,
    or when the entries found disagree (the dataset changed since, or the model's tokenizer): never a guess."""
    sidecar = read_meta(dataset_path)
    try:
        size = dataset_path.stat().st_size
    except OSError:
        return None
    if isinstance(sidecar, dict) and sidecar.get("size_bytes") == size and sidecar.get("sha256"):
        sha = sidecar["sha256"]  # the generator's word for this very file
    else:
        sha = file_sha256(dataset_path)
    names, snapshots = _tokenizer_sources(source)
    found: set[tuple[int, int, Path]] = set()
    for meta_file in (data_dir / PREP_DIR / "encoded").glob(f"*/{META_FILE}"):
        try:
            meta = json.loads(meta_file.read_text())
        except (OSError, ValueError):
            continue
        tok = str(meta.get("tokenizer_source") if isinstance(meta, dict) else "")
        if not (isinstance(meta, dict) and meta.get("dataset_sha256") == sha
                and meta.get("max_length") == max_length and meta.get("text_field") == text_field
                and meta.get("response_template") == template and meta.get("v") == PREP_VERSION
                and (tok in names or (snapshots is not None and snapshots in tok))):
            continue
        entry = meta_file.parent
        if check_entry(entry, str(meta.get("key")), verify=False) is not None:
            continue
        empty = meta.get("entries_without_completion")
        if not isinstance(empty, int):  # prepared before meta.json counted them: count from the data
            import pyarrow as pa  # heavy: only where Arrow or Parquet data is read or written

            with pa.memory_map(str(entry / DATA_FILE)) as src:
                empty = lengths_and_empty(pa.ipc.open_stream(src).read_all().column("completion_mask"))[1]
        found.add((empty, int(meta.get("rows") or 0), entry))
    counts = {(e, r) for e, r, _ in found}
    if len(counts) != 1:
        return None
    return min(found, key=lambda f: str(f[2]))


def masked_warnings(sweep: Any, inv: Any, points: list[Any]) -> None:
    """Add to each valid point of the sbench trainer a warning when its prepared training data (on this
    machine) has entries whose response lies beyond its max length: the trainer masks their whole loss. One
    text per dataset, model and length, so plan says it once."""
    if sweep.runner.workload != "train":
        return
    data_dir = data_dir_for(sweep, inv)
    template = checked_template(RESPONSE_TEMPLATE_ARG)
    seen: dict[tuple[str, str, int, str], str | None] = {}
    for p in points:
        e = p.entity
        if not p.valid or str(e.get("trainer") or "sbench") != "sbench" or not p.model_source:
            continue
        dataset_id = str(e.get("dataset_id") or "news-tokens-16384plus-entries-4096")
        field_ = str(e.get("dataset_text_field") or TEXT_FIELD)
        key = (dataset_id, p.model_source, int(e["model_max_length"]), field_)
        if key not in seen:
            found = masked_entries(data_dir, data_dir / dataset_filename(dataset_id), p.model_source, key[2],
                                   field_, template)
            seen[key] = None if not found or not found[0] else (
                f"{found[0]} of {found[1]} entries of {dataset_id} have no response token within max_seq_length "
                f"{key[2]} ({e['model_name']}'s tokenizer): the trainer masks their whole loss (counted in the "
                f"prepared data {found[2]})")
        if seen[key]:
            p.warnings.append(seen[key])
