"""CLI: test models and synthetic datasets (sbench model ..., sbench dataset ...)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from harness.contract.formats import TEXT_FIELD
from harness.data.datagen import generate_dataset
from harness.data.models import fetch_model, model_cache
from harness.data.tinymodel import DEVICES, SIZES, describe_model, make_tiny_model, make_tiny_vision_model
from harness.data.tokens import dataset_token_counts
from harness.spec.inventory import load_inventory, shared_dir

from .base import echo_json, inventory_option, json_option, main


def _quiet_transformers() -> None:
    """No progress bars or advisory warnings from transformers in command output."""
    from transformers.utils import logging as hf_logging  # heavy: only where a model is built or trained

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


# -- model -------------------------------------------------------------------------------------------------
@main.group()
def model() -> None:
    """Test models built locally (nothing is downloaded).

    Example: sbench model tiny -o models/tiny
    """


@model.command("tiny")
@click.option("-o", "--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Directory to write config, weights and tokenizer into.")
@click.option("--arch", type=click.Choice(["llama", "mixtral", "qwen2"]), default="llama", show_default=True,
              help="llama; mixtral (4 experts, 2 per token) for Mixture-of-Experts rules; qwen2 (biased "
                   "q/k/v projections), another architecture for the memory checks.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the weights and the tokenizer corpus.")
@click.option("--if-missing", is_flag=True, help="Keep an existing model in DIR (one with config.json) as it is.")
@click.option("--vision", is_flag=True, help="A tiny vision-language model instead: LLaVA-NeXT (granite-vision's "
              "family) with a SigLIP vision tower on 32-pixel tiles, a Llama language model and its processor.")
@click.option("--size", type=click.Choice(list(SIZES)), default="tiny", show_default=True,
              help="tiny: the test model; 1b: TinyLlama-1.1B's shape (22 layers, hidden 2048, 32k vocabulary) in "
                   "bfloat16, random weights, for measuring a GPU (llama only).")
@click.option("--device", type=click.Choice(list(DEVICES)), default="auto", show_default=True,
              help="Where the weights are initialised (auto: the CPU for the tiny size, so its weights stay the "
                   "same on every machine; a CUDA device for larger ones when torch sees one).")
def model_tiny(out_dir: Path, arch: str, seed: int, if_missing: bool, vision: bool, size: str, device: str) -> None:
    """Write a tiny random causal LM with a locally trained BPE tokenizer.

    Example: sbench model tiny -o models/tiny-moe --arch mixtral
    Example: sbench model tiny --vision -o models/tiny-vision
    Example: sbench model tiny --size 1b -o models/gpu-1b
    """
    _quiet_transformers()
    if size != "tiny" and (vision or arch != "llama"):
        raise click.UsageError(f"--size {size} builds a Llama; leave out --vision and --arch {arch}")
    if if_missing and (out_dir / "config.json").is_file():
        path = out_dir
    elif vision:
        path = make_tiny_vision_model(out_dir, seed=seed)
    else:
        on = "cpu" if device == "auto" and size == "tiny" else device
        path = make_tiny_model(out_dir, arch=arch, seed=seed, device=on, **SIZES[size])
    d = describe_model(path)
    click.echo(str(path))
    experts = f", {d['experts']} experts" if d["experts"] else ""
    click.echo(f"{d['arch']}: {d['params']:,} params, vocab {d['vocab']}, {d['layers']} layers, "
               f"hidden {d['hidden_size']}{experts}")


@model.command("fetch")
@click.argument("model_id")
@click.option("--cache", "cache", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Shared model cache to download into (default: the inventory's defaults.models_dir, else the "
              "HF cache).")
@inventory_option
def model_fetch(model_id: str, cache: Path | None, inventory: Path | None) -> None:
    """Download an HF model (config, tokenizer, weights) into the shared model cache the jobs read.

    Example: sbench model fetch HuggingFaceTB/SmolLM2-135M --cache /shared/models
    """
    if cache is None:
        inv = load_inventory(inventory)
        models_dir = shared_dir(inv.models_dir, inv)
        cache_s = model_cache(str(models_dir) if models_dir else None)
    else:
        cache_s = str(cache)
    click.echo(str(fetch_model(model_id, cache_s)))


# -- dataset -----------------------------------------------------------------------------------------------
@main.group()
def dataset() -> None:
    """Synthetic benchmark datasets: generate them and count their tokens.

    Example: sbench dataset generate news-chars-512-entries-4096 -o data/news-chars-512-entries-4096.jsonl
    """


def _tokenizer_option(required: bool) -> Callable[[Any], Any]:
    return click.option("--tokenizer", "tokenizer", required=required, default=None, metavar="HF_ID_OR_PATH",
                        help="Tokenizer: a local directory or an HF id available offline.")


@dataset.command("generate")
@click.argument("dataset_id")
@click.option("-o", "--out", "out_path", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="File to write (.jsonl for text ids, .parquet for vision ids); a .meta.json goes next to it.")
@_tokenizer_option(required=False)
@click.option("--entries", type=click.IntRange(min=1), default=None,
              help="Entries to write instead of the count in the id (for quick tests).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the text and images.")
@json_option
def dataset_generate(dataset_id: str, out_path: Path, tokenizer: str | None, entries: int | None, seed: int,
                     as_json: bool) -> None:
    """Generate a dataset of the reference catalog, deterministically from a seed.

    Example: sbench dataset generate news-tokens-16384plus-entries-4096 -o data/news16k.jsonl --tokenizer models/tiny
    """
    if tokenizer:
        _quiet_transformers()
    info = generate_dataset(dataset_id, out_path, tokenizer=tokenizer, entries=entries, seed=seed)
    if as_json:
        echo_json(info.to_dict())
        return
    c = info.chars
    click.echo(f"{info.path}  ({info.format}, {info.size_bytes / 1e6:.1f} MB, {info.elapsed_s:.1f} s)")
    click.echo(f"entries {info.entries}; characters min {c['min']} / avg {c['avg']:g} / max {c['max']}")
    if info.tokens:
        t = info.tokens
        how = "text and image tokens" if info.format == "parquet" else "no special tokens"
        click.echo(f"tokens ({info.tokenizer}, {how}): min {t['min']} / avg {t['avg']:g} / max {t['max']}")
    g = info.length_guarantee
    click.echo(f"length: {g['method']} ({'verified' if g.get('verified') else 'not verified'}): {g['detail']}")


@dataset.command("count")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
@_tokenizer_option(required=True)
@click.option("--max-seq-length", type=click.IntRange(min=1), required=True,
              help="Entries count at most min(this, tokenizer.model_max_length) tokens.")
@click.option("--text-field", default=TEXT_FIELD, show_default=True, help="JSON field / column holding the text.")
@click.option("--cache-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Cache the counts here (keyed by tokenizer, dataset content and max length).")
@json_option
def dataset_count(path: Path, tokenizer: str, max_seq_length: int, text_field: str, cache_dir: Path | None,
                  as_json: bool) -> None:
    """Count a dataset's tokens exactly as runs report them: min(tokens, model_max_length, max_seq_length).

    Example: sbench dataset count data/news-chars-512-entries-4096.jsonl --tokenizer models/tiny --max-seq-length 1024
    """
    _quiet_transformers()
    tc = dataset_token_counts(tokenizer, path, text_field=text_field, max_seq_length=max_seq_length,
                              cache_dir=cache_dir)
    if as_json:
        echo_json({**tc.summary(), "min": min(tc.counts, default=0), "max": max(tc.counts, default=0),
                   "elapsed_s": tc.elapsed_s})
        return
    avg = tc.total / tc.entries if tc.entries else 0.0
    click.echo(f"total {tc.total} tokens over {tc.entries} entries (avg {avg:.1f}, min {min(tc.counts, default=0)}, "
               f"max {max(tc.counts, default=0)}; truncated at {tc.max_length})")
    click.echo(f"cache {tc.cache}  key {tc.key}")
