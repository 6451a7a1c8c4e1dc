"""Does a generated dataset reach the length its name promises, for the model a point trains?

A dataset id such as ``vision-384x384-16384plus-entries-4096`` or ``news-tokens-16384plus-entries-4096``
promises entries of at least that many tokens. The generator keeps the promise for the tokenizer or processor
it was given (``length_guarantee`` in the file's ``.meta.json``); without one a vision file's image copies
follow an estimate of another model's geometry, and with another model's processor its entries can be ten
times shorter (the tiny vision model: 1,277 to 1,359 tokens of a promised 16,384). ``plan`` and ``submit``
call :func:`length_warnings`: where the file is on this machine and the point's model is a local directory,
its first :data:`PROBE_ENTRIES` entries are counted with that model's processor or tokenizer (about a second),
and a point whose entries fall short gets a warning with the counts and the fix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.contract.errors import SbenchError
from harness.contract.formats import IMAGE_FIELD, MESSAGES_FIELD, TEXT_FIELD
from harness.contract.paths import dataset_filename
from harness.spec.catalog import is_vision_dataset
from harness.spec.modelmap import is_local_source
from harness.spec.sweep import data_dir_for

from .datagen import parse_dataset_id, read_meta
from .tokens import _iter_texts, load_tokenizer
from .vision import EntryCounter, _raw_rows, entry_text, load_processor

PROBE_ENTRIES = 8  # the generator writes entries alike (the same image, prose of one length): a few tell


def probe_counts(dataset_path: Path, source: str, vision: bool, text_field: str) -> list[int]:
    """The token counts of the file's first :data:`PROBE_ENTRIES` entries with model *source*'s processor
    (vision: chat template and images) or tokenizer (text, no special tokens, not truncated)."""
    out: list[int] = []
    if vision:
        proc = load_processor(source)
        counter = EntryCounter(proc)
        for row in _raw_rows(dataset_path, [MESSAGES_FIELD, text_field, IMAGE_FIELD]):
            out.append(counter(entry_text(proc, row, text_field), row.get(IMAGE_FIELD) or [])[0])
            if len(out) >= PROBE_ENTRIES:
                break
        return out
    tok = load_tokenizer(source)
    for text in _iter_texts(dataset_path, text_field):
        out.append(len(tok(text, add_special_tokens=False)["input_ids"]))
        if len(out) >= PROBE_ENTRIES:
            break
    return out


def _guarantee(meta: dict[str, Any]) -> dict[str, Any]:
    g = meta.get("length_guarantee")
    return g if isinstance(g, dict) else {}


def _verified_for(meta: dict[str, Any], source: str) -> bool:
    """The file's own word that its promise holds for *source* (counted with its processor or tokenizer)."""
    g = _guarantee(meta)
    if not g.get("verified"):
        return False
    named = str(g.get("processor") or g.get("tokenizer") or "")
    return bool(named) and (named == source
                            or Path(named).expanduser().resolve() == Path(source).expanduser().resolve())


def length_warnings(sweep: Any, inv: Any, points: list[Any]) -> list[str]:
    """Add to each valid training point whose generated dataset falls short of its name's promise, for its own
    model, a warning with the counts (once per dataset and model); returns them, each once, with how many runs
    it concerns."""
    if sweep.runner.workload != "train":
        return []
    data_dir = data_dir_for(sweep, inv)
    runs: dict[str, int] = {}
    said: dict[tuple[str, str], str | None] = {}
    for p in points:
        e = p.entity
        dataset_id = str(e.get("dataset_id") or "")
        source = p.model_source
        if not p.valid or not source or not dataset_id:
            continue
        key = (dataset_id, source)
        if key not in said:
            said[key] = _shortfall(data_dir, dataset_id, source, str(e.get("model_name")),
                                   str(e.get("dataset_text_field") or TEXT_FIELD))
        text = said[key]
        if text:
            p.warnings.append(text)
            runs[text] = runs.get(text, 0) + 1
    return [f"{w} ({n} run(s))" for w, n in runs.items()]


def _shortfall(data_dir: Path, dataset_id: str, source: str, model: str, text_field: str) -> str | None:
    try:
        spec = parse_dataset_id(dataset_id)
    except SbenchError:
        return None
    if spec.kind not in ("tokens", "vision") or not spec.min_tokens:
        return None
    path = data_dir / dataset_filename(dataset_id)
    meta = read_meta(path)
    if not path.is_file() or not isinstance(meta, dict) or _verified_for(meta, source):
        return None  # not generated here yet (prepare generates it), not ours, or kept for this very model
    if not is_local_source(source) or not Path(source).expanduser().is_dir():
        return None  # the model is not on this machine: nothing to count with, never a guess
    try:
        counts = probe_counts(path, source, is_vision_dataset(dataset_id), text_field)
    except Exception:  # noqa: BLE001 - a model that cannot count is said elsewhere (prepare, the job)
        return None
    if not counts or min(counts) >= spec.min_tokens:
        return None
    g = _guarantee(meta)
    how = f"{g.get('method')}, {'verified' if g.get('verified') else 'not verified'}" if g else "no length guarantee"
    return (f"{dataset_id} promises entries of at least {spec.min_tokens} tokens, but with {model}'s "
            f"{'processor' if spec.kind == 'vision' else 'tokenizer'} its first {len(counts)} have {min(counts)} to "
            f"{max(counts)} (the file's length guarantee: {how}); regenerate it for this model: sbench dataset "
            f"generate {dataset_id} -o {path} --tokenizer {source}")
