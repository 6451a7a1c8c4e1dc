"""Vision (image + text) training data prepared once, shared read-only, memory-mapped by every job.

What a job of sbench's trainer would otherwise redo before its first step is the data's own preparation:

- read the Parquet file through ``datasets`` (which converts it into an Arrow cache of its own, on every
  machine, the first time);
- render every entry's messages with the processor's chat template (as fms-hf-tuning's data handler does),
  4096 templates for a seed dataset.

``ensure_vision_prepared`` does this once per processor and dataset and stores, beside the text entries
(:mod:`harness.data.prepared`: the same key directory, lock, atomic publication, size and sha256 check on
every open), an Arrow file of two columns: the entry's images exactly as the dataset file holds them (encoded
PNG, never decoded here) and its rendered text (:data:`VISION_TEXT`). Its token counts are cached with it.

The images are not decoded or processed ahead: both trainers' collators decode and process each batch's
images inside the training step (fms-hf-tuning's ``VisionDataCollator`` as sbench's), so that work is part of
what the benchmark measures, and storing a 4096-entry dataset's processed pixels would take tens of GB.
"""

from __future__ import annotations

import json
import os
import time
from hashlib import sha256
from pathlib import Path
from typing import Any

from harness.contract.errors import InputError, SbenchError
from harness.contract.formats import MESSAGES_FIELD

from .files import file_sha256
from .prepared import DATA_FILE, META_FILE, Prepared, ensure_entry
from .vision import entry_text, load_processor, processor_fingerprint, vision_token_counts

VISION_PREP_VERSION = 1  # bump when the stored columns change meaning: old entries then miss
VISION_TEXT = "sbench_text"  # the column of each entry's rendered text (the processor's chat template)
BATCH_ROWS = 256


def vision_prep_key(fingerprint: str, dataset_sha: str, text_field: str, image_field: str) -> tuple[str, dict]:
    """The entry key and the document it hashes (stored in ``meta.json``)."""
    doc = {"v": VISION_PREP_VERSION, "kind": "vision", "processor": fingerprint, "dataset_sha256": dataset_sha,
           "text_field": text_field, "image_field": image_field}
    return sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest(), doc


def _write(tmp: Path, key: str, key_doc: dict[str, Any], processor: Any, dataset_path: Path, *, text_field: str,
           image_field: str, token_cache: Path | None) -> dict[str, Any]:
    import pyarrow as pa  # heavy: only where Arrow or Parquet data is read or written
    import pyarrow.parquet as pq  # heavy: only where Arrow or Parquet data is read or written

    t0 = time.monotonic()
    pf = pq.ParquetFile(dataset_path)
    names = pf.schema_arrow.names
    if image_field not in names:
        raise InputError(f"{dataset_path}: no column {image_field!r} (--dataset_image_field, the entries' images); "
                         f"it has {', '.join(names)}")
    text_cols = [c for c in (MESSAGES_FIELD, text_field) if c in names]
    if not text_cols:
        raise InputError(f"{dataset_path}: no column {MESSAGES_FIELD!r} or {text_field!r} (the entries' text); "
                         f"it has {', '.join(names)}")
    schema = pa.schema([pf.schema_arrow.field(image_field), pa.field(VISION_TEXT, pa.large_string())])
    rows = 0
    with pa.OSFile(str(tmp / DATA_FILE), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=[image_field, *text_cols]):
            texts = [entry_text(processor, row, text_field) for row in batch.select(text_cols).to_pylist()]
            writer.write_batch(pa.record_batch([batch.column(image_field), pa.array(texts, pa.large_string())],
                                               schema=schema))
            rows += batch.num_rows
    # The exact counts, cached where the jobs' token stage reads them (it then counts nothing).
    counts = vision_token_counts(processor, dataset_path, text_field=text_field, image_field=image_field,
                                 cache_dir=token_cache, dataset_sha=key_doc["dataset_sha256"])
    return {"key": key, **key_doc, "rows": rows, "tokens": counts.total, "image_tokens": sum(counts.image_tokens),
            "token_counts_key": counts.key, "dataset": str(dataset_path),
            "processor_source": str(getattr(processor, "name_or_path", "") or
                                    getattr(processor.tokenizer, "name_or_path", "")),
            "build_s": round(time.monotonic() - t0, 3)}


def open_vision_entry(path: Path, image_field: str) -> Any:
    """The entry as a memory-mapped ``datasets.Dataset`` (images as their encoded ``{"bytes", "path"}`` items,
    decoded by the collator), its columns and row count checked against its meta."""
    from datasets import Dataset  # heavy: only where a dataset is opened
    from datasets.table import MemoryMappedTable  # heavy: only where a dataset is opened

    meta = json.loads((path / META_FILE).read_text())
    table = MemoryMappedTable.from_file(str(path / DATA_FILE))
    if table.column_names != [image_field, VISION_TEXT] or table.num_rows != meta.get("rows"):
        raise SbenchError(f"{path}: prepared vision data has columns {table.column_names} and {table.num_rows} rows; "
                          f"expected {[image_field, VISION_TEXT]} and {meta.get('rows')}")
    return Dataset(table)


def ensure_vision_prepared(processor: Any, dataset_path: str | os.PathLike[str], *, text_field: str,
                           image_field: str, root: str | os.PathLike[str], token_cache: str | os.PathLike[str] | None,
                           open_dataset: bool = True, verify: bool = True) -> Prepared:
    """The prepared vision data of this processor and dataset: checked, built when missing or bad (see
    :func:`harness.data.prepared.ensure_entry`), its exact token counts cached in *token_cache* when built.
    ``processor`` is a processor object, an HF id or a directory; ``open_dataset`` returns the data
    memory-mapped in ``Prepared.dataset``; ``Prepared.doc`` is its meta (``tokens``, ``image_tokens``,
    ``dataset_sha256``)."""
    t0 = time.monotonic()
    proc = load_processor(processor)
    data_path = Path(dataset_path)
    if not data_path.is_file():
        raise InputError(f"dataset file {data_path} does not exist; generate it with: sbench dataset generate ID "
                         f"-o {data_path}")
    dataset_sha = file_sha256(data_path)
    key, key_doc = vision_prep_key(processor_fingerprint(proc), dataset_sha, text_field, image_field)

    def write(tmp: Path) -> dict[str, Any]:
        return _write(tmp, key, key_doc, proc, data_path, text_field=text_field, image_field=image_field,
                      token_cache=Path(token_cache) if token_cache is not None else None)

    path, status, reason, build_s, waited = ensure_entry(
        Path(root), key, verify=verify, write=write,
        why_missing=lambda: "not prepared (for this processor and dataset)")
    meta = json.loads((path / META_FILE).read_text())
    ds = open_vision_entry(path, image_field) if open_dataset else None
    return Prepared(key=key, path=path, status=status, rows=meta["rows"], tokens=int(meta.get("tokens") or 0),
                    elapsed_s=round(time.monotonic() - t0, 3), reason=reason, build_s=build_s, dataset=ds,
                    waited_s=waited, doc=meta)
