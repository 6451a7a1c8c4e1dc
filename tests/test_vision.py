"""Vision-language fine-tuning: the tiny LLaVA-NeXT model, the vision datasets, and real runs of both trainers
on this machine's CPU, their measurements recomputed here from the raw files and the dataset."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

VERSION = "3.2.2"
_LOAD_4X = """
import json, sys
from PIL import Image
from transformers import AutoModelForVision2Seq, AutoProcessor
m, info = AutoModelForVision2Seq.from_pretrained(sys.argv[1], output_loading_info=True)
p = AutoProcessor.from_pretrained(sys.argv[1])
msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "Describe"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A picture"}]}]
text = p.apply_chat_template(msgs, tokenize=False)
b = p(text=[text], images=[[Image.new("RGB", (384, 384), (9, 99, 199))] * 2], return_tensors="pt")
print(json.dumps({"missing": list(info["missing_keys"]), "unexpected": list(info["unexpected_keys"]),
                  "cls": type(m).__name__, "text": text, "ids": b["input_ids"][0].tolist(),
                  "loss": float(m(**b, labels=b["input_ids"]).loss.detach())}))
"""


@pytest.fixture(scope="session")
def tiny_vision(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from harness.data.tinymodel import make_tiny_vision_model

    return make_tiny_vision_model(tmp_path_factory.mktemp("models") / "tiny-vision")


def _load_5x(path: Path) -> dict:
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    m, info = AutoModelForImageTextToText.from_pretrained(str(path), output_loading_info=True)
    p = AutoProcessor.from_pretrained(str(path))
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "Describe"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "A picture"}]}]
    text = p.apply_chat_template(msgs, tokenize=False)
    b = p(text=[text], images=[[Image.new("RGB", (384, 384), (9, 99, 199))] * 2], return_tensors="pt")
    return {"missing": list(info["missing_keys"]), "unexpected": list(info["unexpected_keys"]),
            "cls": type(m).__name__, "text": text, "ids": b["input_ids"][0].tolist(),
            "loss": float(m(**b, labels=b["input_ids"]).loss.detach())}


def test_tiny_vision_model_loads_under_transformers_5_and_4(tiny_vision, cli) -> None:
    from harness.data.tinymodel import VISION_IMAGE_SIZE, VISION_PATCH
    from harness.spec.catalog import is_vision_config, model_config

    cfg = model_config(str(tiny_vision))
    assert cfg is not None and is_vision_config(cfg) and cfg["architectures"] == ["LlavaNextForConditionalGeneration"]
    five = _load_5x(tiny_vision)
    assert five["missing"] == [] and five["unexpected"] == [] and five["cls"] == "LlavaNextForConditionalGeneration"
    image_id = cfg["image_token_index"]
    # A 384x384 image on 32-pixel tiles of 8-pixel patches: anyres picks 2x2 tiles (64x64), so the model sees
    # the base tile's 4x4 features, then the 8x8 grid of the tiles with one newline feature per row.
    side = VISION_IMAGE_SIZE // VISION_PATCH
    per_image = side * side + (2 * side) * (2 * side + 1)
    assert five["ids"].count(image_id) == 2 * per_image
    assert five["loss"] > 0
    from harness.data.trainerenv import build
    from harness.spec.envs import envs_root

    env, _ = build(VERSION, envs_root(None), extras=("fms-accel",))
    out = subprocess.run([str(env.python), "-c", _LOAD_4X, str(tiny_vision)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    four = json.loads(out.stdout.strip().splitlines()[-1])
    assert four["missing"] == [] and four["unexpected"] == [] and four["cls"] == "LlavaNextForConditionalGeneration"
    # Same text, same tokens, same weights: the same loss under both majors.
    assert four["text"] == five["text"] and four["ids"] == five["ids"]
    assert four["loss"] == pytest.approx(five["loss"], rel=1e-4)
    res = cli("model", "tiny", "--vision", "-o", tiny_vision.parent / "cli")
    assert res.exit_code == 0 and "llava_next" in res.output
