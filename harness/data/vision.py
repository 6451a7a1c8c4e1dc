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

COUNTS_VERSION = 1


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
    """(tokens, image tokens) the processor makes of one entry."""
    ids = processor(text=[text], images=[images] if images else None, return_tensors="np")["input_ids"][0]
    return int(len(ids)), int((ids == image_id).sum())


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
    file = Path(cache_dir) / f"vision-{key}.json" if cache_dir is not None else None
    if file is not None and file.is_file():
        try:
            doc = json.loads(file.read_text())
            if doc.get("key") == key:
                return VisionCounts(list(doc["counts"]), list(doc["image_tokens"]), "hit", key,
                                    round(time.monotonic() - t0, 3))
        except (OSError, ValueError, KeyError):
            pass  # a damaged cache file is recounted and rewritten
    data = open_vision_dataset(path)
    image_id = image_token_id(proc)
    counts, images = [], []
    for row in data:
        n, img = count_entry(proc, entry_text(proc, row, text_field), entry_images(row, image_field), image_id)
        counts.append(n)
        images.append(img)
    if file is not None:
        file.parent.mkdir(parents=True, exist_ok=True)
        tmp = file.with_name(f".{file.name}.{os.getpid()}")
        tmp.write_text(json.dumps({"key": key, "counts": counts, "image_tokens": images, "dataset": str(path),
                                   "text_field": text_field, "image_field": image_field}))
        os.replace(tmp, file)
    return VisionCounts(counts, images, "miss" if file is not None else "off", key, round(time.monotonic() - t0, 3))
