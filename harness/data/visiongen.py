"""Vision datasets (``vision-<W>x<H>-<N>plus-entries-<E>``) as Parquet: each entry the same synthetic picture
(``png``), repeated until the entry reaches its tokens, with news prose (``newstext``) for its caption; the chat
messages the trainers render, and the same entry flat. The copies per entry come from the model's own processor
when one is given, else from an estimate of granite-vision-3.2-2b's geometry (``meta.json`` says which)."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any, Protocol

from harness.contract.errors import InputError, SbenchError
from harness.contract.formats import IMAGE_FIELD, MESSAGES_FIELD, TEXT_FIELD

from .files import file_sha256
from .newstext import chars_text, entry, sentence_pool
from .png import synthetic_png
from .vision import count_entry, entry_text, image_token_id, load_processor, vision_token_counts

IMAGE_TOKEN = "<image>"
VISION_PROMPT = "Describe what these pictures show, as a news caption."


def vision_messages(images: int, response: str) -> list[dict[str, Any]]:
    """A vision entry's chat: the user turn's *images* image items and the prompt, the assistant's response.
    Every item has both struct fields (Parquet's shape); ``text`` is None on an image item."""
    return [{"role": "user", "content": [{"type": "image", "text": None}] * images
             + [{"type": "text", "text": VISION_PROMPT}]},
            {"role": "assistant", "content": [{"type": "text", "text": response}]}]


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


class VisionShape(Protocol):
    """What the writer reads of a vision dataset id (``datagen.DatasetSpec``)."""

    @property
    def dataset_id(self) -> str: ...

    @property
    def width(self) -> int: ...

    @property
    def height(self) -> int: ...

    @property
    def min_tokens(self) -> int: ...


def _processor_copies(spec: VisionShape, processor: Any, png: bytes, pool: Any, seed: int) -> tuple[int, int]:
    """(image copies per entry, image tokens per copy) with the model's own processor: the copies that bring
    the text of the shortest probe entry to ``min_tokens`` counting every token the model sees."""
    import io

    from PIL import Image  # heavy: only where images are decoded

    image = Image.open(io.BytesIO(png)).convert("RGB")
    image_id = image_token_id(processor)
    response = chars_text(random.Random(f"sbench:{spec.dataset_id}:{seed}:probe"), pool, 512)
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


def write_vision_parquet(tmp: Path, spec: VisionShape, n: int, seed: int, stats: dict[str, list[int]],
                         processor_source: Any = None) -> tuple[str, int, int, dict[str, Any]]:
    """Write *n* vision entries to *tmp*; with *processor_source* (a vision-language model's directory or processor) the
    image copies per entry come from its exact count, and every entry is counted after it is written."""
    import pyarrow as pa  # heavy: only where Arrow or Parquet data is read or written
    import pyarrow.parquet as pq  # heavy: only where Arrow or Parquet data is read or written
    from datasets import Features, Image, List, Value  # heavy: only where a dataset is opened

    png = synthetic_png(spec.width, spec.height, seed)
    pool, _ = sentence_pool(seed)
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
                    response = chars_text(rng, pool, 512)
                    texts.append(entry(IMAGE_TOKEN * copies + "\n" + VISION_PROMPT, response))
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
