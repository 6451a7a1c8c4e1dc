"""Vision (image + text) datasets as the trainers see them.

An entry of a vision dataset (Parquet, see :mod:`harness.data.datagen`) holds its images
(:data:`~harness.contract.formats.IMAGE_FIELD`), its chat messages
(:data:`~harness.contract.formats.MESSAGES_FIELD`: a user turn of ``{"type": "image"}`` items and a text item,
an assistant turn) and the same text flat (:data:`~harness.contract.formats.TEXT_FIELD`, an ``<image>`` token
per image). Both trainers render the messages with the processor's chat template, as fms-hf-tuning's
``apply_tokenizer_chat_template`` handler does, and hand text and images to the processor, which expands each
image token into the image's features. So the tokens the model sees are the processor's ``input_ids``: the
text tokens and the image tokens, counted here exactly per entry (:func:`vision_token_counts`) and cached
under a key over the processor, the dataset's sha256 and the columns.

These functions run in sbench's environment (transformers 5) and in an fms-hf-tuning release's (4.x).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.contract.errors import InputError
from harness.contract.formats import IMAGE_FIELD, MESSAGES_FIELD, TEXT_FIELD

from .files import file_sha256
from .tokens import tokenizer_fingerprint

COUNTS_VERSION = 2


def load_processor(source: Any) -> Any:
    """The model's processor (``AutoProcessor``) from an object, an HF id or a directory."""
    if not isinstance(source, (str, os.PathLike)):
        return source
    from transformers import AutoProcessor  # heavy: only where a processor is used

    return AutoProcessor.from_pretrained(str(source))


def image_token_id(processor: Any) -> int:
    """The id of the token the processor expands into an image's features."""
    token = getattr(processor, "image_token", None) or "<image>"
    return int(processor.tokenizer.convert_tokens_to_ids(token))


def open_vision_dataset(path: str | os.PathLike[str]) -> Any:
    """The Parquet file as a ``datasets.Dataset`` (images decoded with Pillow on access)."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"dataset file {p} does not exist; generate it with: sbench dataset generate ID -o {p}")
    from datasets import load_dataset  # heavy: only where a dataset is opened

    return load_dataset("parquet", data_files=str(p), split="train")


def entry_text(processor: Any, row: dict[str, Any], text_field: str = TEXT_FIELD) -> str:
    """The text of one entry as the model gets it: its messages through the processor's chat template
    (fms-hf-tuning's rendering), else the flat text field as written."""
    messages = row.get(MESSAGES_FIELD)
    if messages:
        return str(processor.apply_chat_template(_clean(messages), tokenize=False))
    return str(row[text_field])


def _clean(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Parquet gives every content item every struct field (``text: None`` on an image item): drop the Nones,
    as the messages were written."""
    out = []
    for m in messages:
        content = m["content"]
        if isinstance(content, list):
            content = [{k: v for k, v in item.items() if v is not None} for item in content]
        out.append({**m, "content": content})
    return out


def entry_images(row: dict[str, Any], image_field: str = IMAGE_FIELD) -> list[Any]:
    """The entry's images as RGB PIL images, in order."""
    images = row[image_field]
    images = images if isinstance(images, list) else [images]
    out = []
    for im in images:
        if isinstance(im, dict) and im.get("bytes") is not None:  # not decoded (a plain Arrow struct)
            import io

            from PIL import Image  # heavy: only where images are decoded

            im = Image.open(io.BytesIO(im["bytes"]))
        out.append(im.convert("RGB") if getattr(im, "mode", "RGB") != "RGB" else im)
    return out


@dataclass
class VisionCounts:
    """Per entry: the tokens the model sees (text + image) and the image tokens among them."""

    counts: list[int]
    image_tokens: list[int]
    cache: str  # hit | miss | off
    key: str
    elapsed_s: float

    @property
    def total(self) -> int:
        return sum(self.counts)

    def summary(self) -> dict[str, Any]:
        return {"entries": len(self.counts), "total": self.total, "image_tokens": sum(self.image_tokens),
                "text_tokens": self.total - sum(self.image_tokens), "cache": self.cache, "key": self.key,
                "min": min(self.counts, default=0), "max": max(self.counts, default=0),
                "method": "processor (chat template + images), no truncation"}


def processor_fingerprint(processor: Any) -> str:
    """The tokenizer's fingerprint and the image processor's settings: what decides the counts."""
    image = getattr(processor, "image_processor", None)
    doc = image.to_dict() if image is not None and hasattr(image, "to_dict") else {}
    doc = {k: v for k, v in doc.items() if not k.startswith("_")}
    settings = {k: getattr(processor, k, None) for k in ("patch_size", "vision_feature_select_strategy",
                                                          "num_additional_image_tokens", "image_token")}
    blob = json.dumps({"tokenizer": tokenizer_fingerprint(processor.tokenizer), "image": doc, "processor": settings,
                       "template": getattr(processor, "chat_template", None)}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def count_entry(processor: Any, text: str, images: list[Any], image_id: int) -> tuple[int, int]:
    """(tokens, image tokens) the processor makes of one entry: the processor itself, images and all."""
    ids = processor(text=[text], images=[images] if images else None, return_tensors="np")["input_ids"][0]
    return int(len(ids)), int((ids == image_id).sum())


class EntryCounter:
    """:func:`count_entry`'s figures without processing every image: the processor turns each image token of
    the text into as many as the image's features, a number that depends on the image's size only, and the
    image token is a special token, so the text around it tokenizes the same either way. So an entry's count
    is its text's tokens with one token per image, plus each image's extra tokens, asked of the processor once
    per image size (tests compare it with :func:`count_entry` entry by entry)."""

    def __init__(self, processor: Any) -> None:
        self.processor = processor
        self.image_id = image_token_id(processor)
        self.token = getattr(processor, "image_token", None) or "<image>"
        self.per_size: dict[tuple[int, int], int] = {}

        self.sizes: dict[int, tuple[int, int]] = {}  # hash of an encoded image -> its size (read off its header)

    def image_tokens(self, image: Any) -> int:
        """The tokens of one image: a PIL image, or a Parquet ``{"bytes": ...}`` item, whose size is read off
        its header (the same bytes once) and which is decoded only the first time its size is seen."""
        size: tuple[int, int]
        if isinstance(image, dict):
            key = hash(image["bytes"])
            if key not in self.sizes:
                import io

                from PIL import Image  # heavy: only where images are decoded

                width, height = Image.open(io.BytesIO(image["bytes"])).size
                self.sizes[key] = (int(width), int(height))
            size = self.sizes[key]
            if size not in self.per_size:
                image = entry_images({"i": [image]}, "i")[0]
        else:
            size = (int(image.size[0]), int(image.size[1]))
        if size not in self.per_size:
            self.per_size[size] = count_entry(self.processor, self.token, [image], self.image_id)[1]
        return self.per_size[size]

    def __call__(self, text: str, images: list[Any]) -> tuple[int, int]:
        ids = self.processor.tokenizer(text)["input_ids"]
        markers = sum(1 for t in ids if t == self.image_id)
        if markers != len(images):  # let the processor itself say what is wrong
            return count_entry(self.processor, text, entry_images({"i": images}, "i"), self.image_id)
        expanded = sum(self.image_tokens(im) for im in images)
        return len(ids) - markers + expanded, expanded


def _raw_rows(path: Path, columns: list[str]) -> Any:
    """The file's rows as plain Python, images as their encoded ``{"bytes", "path"}`` items (not decoded)."""
    import pyarrow.parquet as pq  # heavy: only where Arrow or Parquet data is read or written

    pf = pq.ParquetFile(path)
    names = set(pf.schema_arrow.names)
    for batch in pf.iter_batches(batch_size=64, columns=[c for c in columns if c in names]):
        yield from batch.to_pylist()


def vision_counts_file(cache_dir: str | os.PathLike[str] | None, key: str) -> Path | None:
    """Where the counts of key *key* are cached (None: no cache)."""
    return Path(cache_dir) / f"vision-{key}.json" if cache_dir is not None else None


def vision_token_counts(processor: Any, dataset_path: str | os.PathLike[str], *, text_field: str = TEXT_FIELD,
                        image_field: str = IMAGE_FIELD, cache_dir: str | os.PathLike[str] | None = None,
                        dataset_sha: str | None = None) -> VisionCounts:
    """Exact per-entry counts of the tokens the model sees, text and image, and of the image tokens.

    The vision collators of both trainers pad and never truncate (cutting into an image's tokens would
    break the model's image features), so an entry's count is its whole processed length."""
    t0 = time.monotonic()
    proc = load_processor(processor)
    path = Path(dataset_path)
    if not path.is_file():
        raise InputError(f"dataset file {path} does not exist; generate it with: sbench dataset generate ID -o {path}")
    key = hashlib.sha256(json.dumps([COUNTS_VERSION, processor_fingerprint(proc), dataset_sha or file_sha256(path),
                                     text_field, image_field]).encode()).hexdigest()[:32]
    file = vision_counts_file(cache_dir, key)
    if file is not None and file.is_file():
        try:
            doc = json.loads(file.read_text())
            if doc.get("key") == key:
                return VisionCounts(list(doc["counts"]), list(doc["image_tokens"]), "hit", key,
                                    round(time.monotonic() - t0, 3))
        except (OSError, ValueError, KeyError):
            pass  # a damaged cache file is recounted and rewritten
    counter = EntryCounter(proc)
    counts, images = [], []
    for row in _raw_rows(path, [MESSAGES_FIELD, text_field, image_field]):
        if image_field not in row:
            raise InputError(f"{path}: no column {image_field!r} (the dataset's images)")
        n, img = counter(entry_text(proc, row, text_field), row[image_field] or [])
        counts.append(n)
        images.append(img)
    if file is not None:
        file.parent.mkdir(parents=True, exist_ok=True)
        tmp = file.with_name(f".{file.name}.{os.getpid()}")
        tmp.write_text(json.dumps({"key": key, "counts": counts, "image_tokens": images, "dataset": str(path),
                                   "text_field": text_field, "image_field": image_field}))
        os.replace(tmp, file)
    return VisionCounts(counts, images, "miss" if file is not None else "off", key, round(time.monotonic() - t0, 3))
