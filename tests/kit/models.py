"""The test models' checkpoints, read independently of sbench: what a recomputation counts on."""

from __future__ import annotations

import math
from pathlib import Path


def on_disk_params(model_dir: Path) -> dict[str, int]:
    """Elements per tensor, read from the checkpoint's headers."""
    from safetensors import safe_open

    out = {}
    for f in Path(model_dir).glob("*.safetensors"):
        with safe_open(str(f), "pt") as st:
            for k in st.keys():
                out[k] = math.prod(st.get_slice(k).get_shape())
    return out


def matmul_params(model_dir: Path) -> int:
    """The parameters that multiply per token: all but the input embedding table (a lookup; the test models'
    output projection is untied)."""
    disk = on_disk_params(model_dir)
    return sum(disk.values()) - next(v for k, v in disk.items() if k.endswith("embed_tokens.weight"))
