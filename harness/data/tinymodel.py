"""A tiny random causal LM with a locally trained tokenizer, for tests and CPU smoke runs.

Nothing is downloaded: the byte-level BPE tokenizer is trained on sbench's own synthetic
news corpus (``harness.data.newstext.news_corpus``), so it splits the benchmark datasets the way a
real tokenizer would, only with a much smaller vocabulary. The directory loads through the
ordinary ``AutoTokenizer.from_pretrained`` / ``AutoModelForCausalLM.from_pretrained`` path.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from harness.contract.errors import InputError, SbenchError

from .newstext import news_corpus
from .visiongen import IMAGE_TOKEN

ARCHS = ("llama", "mixtral", "qwen2")
# Shapes ``sbench model tiny --size`` builds. ``tiny``: the test model (float32, trains in seconds on a CPU).
# ``1b``: TinyLlama-1.1B's shape (22 layers of hidden 2048, 32 heads over 4 key/value heads, a 5632-wide gated MLP,
# a 32000-token vocabulary, untied embeddings): a model a GPU measures like a real one, written in bfloat16. The
# locally trained tokenizer uses as much of the vocabulary as the corpus gives (about 2000 tokens); the embedding
# and the LM head keep all 32000 rows, so the logits cost what a real 32k-vocabulary model's do.
SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"vocab_size": 512, "hidden_size": 64, "num_layers": 2, "num_heads": 4},
    "1b": {"vocab_size": 32000, "hidden_size": 2048, "num_layers": 22, "num_heads": 32, "num_kv_heads": 4,
           "intermediate_size": 5632, "dtype": "bfloat16"},
}
DEVICES = ("auto", "cpu", "cuda")
SPECIAL_TOKENS = {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}
_CORPUS_CHARS = 400_000  # enough text for every merge of a 512-entry vocabulary; trains in well under a second


def train_tokenizer(*, vocab_size: int = 512, model_max_length: int = 4096, seed: int = 0) -> Any:
    """A ``PreTrainedTokenizerFast``: byte-level BPE trained on the synthetic news corpus.

    Like Llama's tokenizer it adds ``<s>`` in front of every sequence and nothing at the end.
    """
    # heavy: only where a tokenizer is trained
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast  # heavy: as above

    specials = list(SPECIAL_TOKENS.values())
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + len(specials):
        raise InputError(f"vocab_size must be at least {len(alphabet) + len(specials)} (256 bytes + "
                         f"{len(specials)} special tokens), got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, initial_alphabet=alphabet,
                                  show_progress=False)
    tok.train_from_iterator(news_corpus(_CORPUS_CHARS, seed=seed), trainer)
    bos = SPECIAL_TOKENS["bos_token"]
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                       special_tokens=[(bos, tok.token_to_id(bos))])
    return PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=model_max_length, **SPECIAL_TOKENS)


def make_tiny_model(out_dir: str | os.PathLike[str], *, arch: str = "llama", vocab_size: int = 512,
                    hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4,
                    max_position_embeddings: int = 4096, seed: int = 0, num_kv_heads: int | None = None,
                    intermediate_size: int | None = None, dtype: str = "float32", device: str = "cpu") -> Path:
    """Write a tiny random Llama (or Mixtral: 4 experts, 2 per token; or Qwen2: biased q/k/v projections)
    and its tokenizer to ``out_dir``. :data:`SIZES` holds the shapes ``sbench model tiny --size`` names.

    *num_kv_heads* defaults to half the heads (grouped-query attention) and *intermediate_size* to twice the
    hidden size; *dtype* is the dtype the weights are written in; *device* where they are initialised
    (``auto``: a CUDA device when there is one; a billion parameters initialise in a second there, in a minute
    on a CPU). Weights are seeded, so the same arguments on the same kind of device give the same checkpoint.
    """
    if arch not in ARCHS:
        raise InputError(f"unknown arch {arch!r}; choose one of: {', '.join(ARCHS)}")
    if device not in DEVICES:
        raise InputError(f"unknown device {device!r}; choose one of: {', '.join(DEVICES)}")
    _check_sizes(hidden_size, num_layers, num_heads, max_position_embeddings)
    if num_kv_heads is not None and (num_kv_heads < 1 or num_heads % num_kv_heads):
        raise InputError(f"num_kv_heads ({num_kv_heads}) must be a positive divisor of num_heads ({num_heads})")
    if intermediate_size is not None and intermediate_size < 1:
        raise InputError(f"intermediate_size must be a positive integer, got {intermediate_size}")
    import torch  # heavy: only where a model is built or trained
    from transformers import (  # heavy: as above
        LlamaConfig,
        LlamaForCausalLM,
        MixtralConfig,
        MixtralForCausalLM,
        PreTrainedConfig,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    weights_dtype = getattr(torch, dtype, None)
    if not isinstance(weights_dtype, torch.dtype) or not weights_dtype.is_floating_point:
        raise InputError(f"dtype {dtype!r} is not a floating-point torch dtype (e.g. float32, bfloat16)")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    elif device == "cuda" and not torch.cuda.is_available():
        raise SbenchError("--device cuda: torch sees no CUDA device here (use --device cpu or auto)")
    out = _model_dir(out_dir)
    tokenizer = train_tokenizer(vocab_size=vocab_size, model_max_length=max_position_embeddings, seed=seed)
    common = _lm_config(tokenizer, max(vocab_size, len(tokenizer)), hidden_size, num_layers, num_heads,
                        max_position_embeddings)
    if num_kv_heads is not None:
        common["num_key_value_heads"] = num_kv_heads
    if intermediate_size is not None:
        common["intermediate_size"] = intermediate_size
    if arch == "mixtral":
        config: PreTrainedConfig = MixtralConfig(num_local_experts=4, num_experts_per_tok=2, **common)
        cls: Any = MixtralForCausalLM
    elif arch == "qwen2":
        config = Qwen2Config(**common)
        cls = Qwen2ForCausalLM
    else:
        config = LlamaConfig(**common)
        cls = LlamaForCausalLM
    # The seed fixes the random init; fork_rng keeps the caller's global torch RNG (and the device's) untouched.
    on = torch.device(device)
    with torch.random.fork_rng(devices=[torch.cuda.current_device()] if on.type == "cuda" else []), on:
        torch.manual_seed(seed)
        model = cls(config).to(weights_dtype)
    try:
        model.to("cpu").save_pretrained(out)
        tokenizer.save_pretrained(out)
        _portable(out)
    except OSError as exc:
        raise SbenchError(f"cannot write the tiny model to {out}: {exc}") from exc
    return out


def _check_sizes(hidden_size: int, num_layers: int, num_heads: int, max_position_embeddings: int) -> None:
    for name, value in (("hidden_size", hidden_size), ("num_layers", num_layers), ("num_heads", num_heads),
                        ("max_position_embeddings", max_position_embeddings)):
        if value < 1:
            raise InputError(f"{name} must be a positive integer, got {value}")
    if hidden_size % num_heads:
        raise InputError(f"hidden_size ({hidden_size}) must be divisible by num_heads ({num_heads})")


def _model_dir(out_dir: str | os.PathLike[str]) -> Path:
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot create model directory {out}: {exc.strerror}") from exc
    return out


def _lm_config(tokenizer: Any, vocab_size: int, hidden_size: int, num_layers: int, num_heads: int,
               max_position_embeddings: int) -> dict[str, Any]:
    """The language model's config keys, shared by the text models and the vision model's language model."""
    return dict(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers, num_attention_heads=num_heads,
        # Grouped-query attention where the head count allows, as in the real Llama 3 / Mixtral.
        num_key_value_heads=num_heads // 2 if num_heads % 2 == 0 else num_heads,
        max_position_embeddings=max_position_embeddings, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False,
    )


def _portable(out: Path) -> None:
    """Make the directory load under transformers 4.x as well (the fms-hf-tuning trainer's environment):
    name the tokenizer class both majors know, and keep the rope base where 4.x reads it. A checkpoint
    from the hub is written that way already; this one must not be the odd one out."""
    tc = out / "tokenizer_config.json"
    doc = json.loads(tc.read_text())
    doc["tokenizer_class"] = "PreTrainedTokenizerFast"
    tc.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    cc = out / "config.json"
    cfg = json.loads(cc.read_text())
    rope = cfg.get("rope_parameters") or {}
    if "rope_theta" not in cfg and "rope_theta" in rope:
        cfg["rope_theta"] = rope["rope_theta"]
        cc.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


# The tiny vision-language model: LLaVA-NeXT (granite-vision-3.2-2b's family) with a SigLIP vision tower
# on 32-pixel tiles of 8-pixel patches (16 features a tile), anyres up to 2x2 tiles, and a Llama language model.
VISION_IMAGE_SIZE = 32
VISION_PATCH = 8
VISION_PINPOINTS = [[32, 32], [32, 64], [64, 32], [64, 64]]
# Renders OpenAI-style messages (content a string, or a list of {"type": "image"} / {"type": "text", "text": ...}
# items) with one image token per image item, as granite-vision's template does.
VISION_CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}" + IMAGE_TOKEN + "{% else %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{{ '\\n' }}{% endif %}")


def make_tiny_vision_model(out_dir: str | os.PathLike[str], *, vocab_size: int = 512, hidden_size: int = 64,
                           num_layers: int = 2, num_heads: int = 4, max_position_embeddings: int = 4096,
                           seed: int = 0) -> Path:
    """Write a tiny random LLaVA-NeXT (``LlavaNextForConditionalGeneration``: SigLIP vision tower, projector,
    Llama language model) and its processor (anyres image processor on 32-pixel tiles, the BPE tokenizer
    with an ``<image>`` token, a chat template for messages with image items) to ``out_dir``.

    The directory loads with ``AutoProcessor`` and ``AutoModelForImageTextToText`` (transformers 5) and
    ``AutoModelForVision2Seq`` (transformers 4.x, the fms-hf-tuning trainer's environment)."""
    _check_sizes(hidden_size, num_layers, num_heads, max_position_embeddings)
    import torch  # heavy: only where a model is built or trained
    from transformers import (  # heavy: as above
        LlamaConfig,
        LlavaNextConfig,
        LlavaNextForConditionalGeneration,
        LlavaNextImageProcessorPil,
        LlavaNextProcessor,
        SiglipVisionConfig,
    )

    out = _model_dir(out_dir)
    tokenizer = train_tokenizer(vocab_size=vocab_size, model_max_length=max_position_embeddings, seed=seed)
    tokenizer.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    image_token_id = tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    images = LlavaNextImageProcessorPil(
        size={"shortest_edge": VISION_IMAGE_SIZE}, crop_size={"height": VISION_IMAGE_SIZE, "width": VISION_IMAGE_SIZE},
        image_grid_pinpoints=VISION_PINPOINTS, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    processor = LlavaNextProcessor(image_processor=images, tokenizer=tokenizer, patch_size=VISION_PATCH,
                                   vision_feature_select_strategy="full", chat_template=VISION_CHAT_TEMPLATE,
                                   image_token=IMAGE_TOKEN)
    vision = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=num_layers,
                                num_attention_heads=2, image_size=VISION_IMAGE_SIZE, patch_size=VISION_PATCH)
    text = LlamaConfig(**_lm_config(tokenizer, len(tokenizer), hidden_size, num_layers, num_heads,
                                    max_position_embeddings))
    config = LlavaNextConfig(
        vision_config=vision, text_config=text, image_token_index=image_token_id,
        vision_feature_select_strategy="full", vision_feature_layer=-1, image_grid_pinpoints=VISION_PINPOINTS,
        image_seq_length=(VISION_IMAGE_SIZE // VISION_PATCH) ** 2, tie_word_embeddings=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlavaNextForConditionalGeneration(config)
    try:
        model.save_pretrained(out)
        processor.save_pretrained(out)
        _portable(out)
        _portable_vision(out)
    except OSError as exc:
        raise SbenchError(f"cannot write the tiny vision model to {out}: {exc}") from exc
    return out


def _portable_vision(out: Path) -> None:
    """The processor and weights of the tiny vision model as transformers 4.x reads them as well: the image
    processor in ``preprocessor_config.json`` (5 nests it in ``processor_config.json``), the image token in
    ``additional_special_tokens`` (5 writes a list under ``extra_special_tokens``, which 4.x reads as a
    dict), the text config's rope base at its 4.x key, and the vision tower's weights under
    ``vision_tower.vision_model.`` (the hub's layout, which both majors load)."""
    from safetensors.torch import load_file, save_file  # heavy: only where weights are read

    pc = out / "processor_config.json"
    doc = json.loads(pc.read_text())
    image_doc = doc.pop("image_processor", None)
    if image_doc is not None:
        image_doc["image_processor_type"] = "LlavaNextImageProcessor"
        (out / "preprocessor_config.json").write_text(
            json.dumps({**image_doc, "processor_class": "LlavaNextProcessor"}, indent=2, sort_keys=True) + "\n")
        pc.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    tc = out / "tokenizer_config.json"
    tdoc = json.loads(tc.read_text())
    extra = tdoc.pop("extra_special_tokens", None)
    if isinstance(extra, list):
        tdoc["additional_special_tokens"] = extra
    tc.write_text(json.dumps(tdoc, indent=2, sort_keys=True) + "\n")
    cc = out / "config.json"
    cfg = json.loads(cc.read_text())
    text = cfg.get("text_config") or {}
    rope = text.get("rope_parameters") or {}
    if "rope_theta" not in text and "rope_theta" in rope:
        text["rope_theta"] = rope["rope_theta"]
        cc.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    for f in sorted(out.glob("*.safetensors")):
        weights = load_file(str(f))
        prefix, hub = "vision_tower.", "vision_tower.vision_model."
        if any(k.startswith(prefix) and not k.startswith(hub) for k in weights):
            save_file({(hub + k[len(prefix):] if k.startswith(prefix) and not k.startswith(hub) else k): v
                       for k, v in weights.items()}, str(f), metadata={"format": "pt"})


def describe_model(model_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Parameter count, vocabulary and layers of a model directory, read from its config and weights."""
    from safetensors import safe_open  # heavy: only where weights are read

    d = Path(model_dir)
    config = json.loads((d / "config.json").read_text())
    params = 0
    for f in sorted(d.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            for k in st.keys():
                n = 1
                for dim in st.get_slice(k).get_shape():
                    n *= dim
                params += n
    text = config.get("text_config") or config
    return {"path": str(d), "arch": config.get("model_type"), "params": params, "vocab": text.get("vocab_size"),
            "layers": text.get("num_hidden_layers"), "hidden_size": text.get("hidden_size"),
            "experts": config.get("num_local_experts")}
