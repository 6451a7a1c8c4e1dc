"""A synthetic picture as PNG bytes, encoded here (zlib and struct: no image library needed to write one)."""

from __future__ import annotations

import struct
import zlib


def synthetic_png(width: int, height: int, seed: int) -> bytes:
    """An RGB PNG of a simple synthetic scene.

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
