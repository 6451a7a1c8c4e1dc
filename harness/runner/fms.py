"""The fms-hf-tuning trainer: ``python -m harness.runner.fms <reference flags> <sbench flags>``.

Runs in the release's own environment (harness.trainerenv), with sbench's package on PYTHONPATH.
As the reference does, it is a thin entry point around fms-hf-tuning's ``tuning.sft_trainer``:
``main()`` parses the reference command line with fms-hf-tuning's own parser and calls ``train()``;
this module only adds sbench's callback to ``train()``'s ``additional_callbacks`` and leaves
everything else to the release. So the numbers are that release's, and every sbench measurement
works as with the sbench trainer (:mod:`harness.runner.train`; the per-rank frame of :mod:`harness.runner.rank`
and the measurements of :mod:`harness.runner.measure` are the same code):

- stages ``launch``, ``tokens`` (sbench's note-3 token counts), ``model_load`` (fms-hf-tuning
  loads the model first), ``dataset`` (its ``process_dataargs``), ``trainer_init`` and ``train``;
- the stop policy (``--stop_after_seconds``, auto-stop), injected faults and memory snapshots run in
  the same callback;
- dataset tokens are note 3's count of each entry the steps consumed: the batches' rows are matched
  to the entries of the training set by their token ids, and counted with sbench's counts;
- an exception inside ``train()`` is recorded before fms-hf-tuning turns it into an exit code, so
  OOM and other errors are classified as with the sbench trainer.

sbench's own flags (:data:`harness.build.trainargs.OWN_FLAGS`) are taken out before fms-hf-tuning parses.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import sys
import time
from collections import deque
from typing import Any

from harness.build.trainargs import OWN_FLAGS
from harness.contract.atomic import write_json
from harness.contract.formats import Stage
from harness.data.prepared import TOKEN_CACHE_DIR
from harness.data.tokens import dataset_token_counts
from harness.data.vision import entry_text, load_processor, open_vision_dataset, vision_token_counts
from harness.spec.flops import model_counts

from . import rank
from . import train as base
from .devices import backend_name, device_info, what_ran, wrapping
from .measure import Meter, StopPolicy, make_callback, measurements, run_totals
from .memsnap import MemoryRecorder
from .rank import Context, launch_end
from .stages import Terminated, signalled

TRAINER_PACKAGES = ("fms-hf-tuning", "torch", "transformers", "trl", "peft", "accelerate", "datasets",
                    "fms-acceleration", "fms-acceleration-peft", "fms-acceleration-foak", "fms-acceleration-moe")


def fms_argv(argv: list[str]) -> list[str]:
    """*argv* without sbench's own flags (each takes one value)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in OWN_FLAGS:
            skip = True
            continue
        out.append(a)
    return out


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for p in TRAINER_PACKAGES:
        try:
            out[p] = md.version(p)
        except md.PackageNotFoundError:
            out[p] = None
    return out


class EntryCounts:
    """Note 3's token count of each entry, looked up by the entry's token ids as fms-hf-tuning encoded
    them (its rows keep the file's order, so row i is entry i); also which entries the steps consumed."""

    KEEP = 1_000_000  # entry indices kept per rank (``rank.<r>.json``: ``entries_consumed``)

    def __init__(self, lengths: list[int], images: list[int] | None = None, text_field: str | None = None) -> None:
        self.lengths = lengths
        # A vision dataset: fms-hf-tuning's rows hold the rendered text (its chat template's) and the images,
        # not token ids; its collator runs the processor. Rows are matched to entries by that text, and each
        # entry's image tokens (*images*) are counted beside its tokens.
        self.images = images or [0] * len(lengths)
        self.text_field = text_field
        self.index: dict[int, int] | None = None
        self.problem: str | None = None
        self.pending: deque[list[int]] = deque()
        self.consumed: list[int] = []
        self.last_images = 0

    @staticmethod
    def key(ids: Any) -> int:
        import numpy as np  # heavy: only where arrays are built

        return hash(np.asarray(ids, dtype=np.int64).tobytes())

    def row_key(self, row: dict[str, Any]) -> int:
        return hash(str(row[self.text_field])) if self.text_field else self.key(row["input_ids"])

    def bind_texts(self, texts: list[str]) -> None:
        """A vision dataset: index the entries by the text sbench rendered for each (the same chat template)."""
        self.index = {}
        for i, text in enumerate(texts):
            self.index.setdefault(hash(text), i)

    def bind(self, dataset: Any) -> None:
        """Index the training set's rows by their token ids, straight from Arrow, a chunk at a time: a
        4096-entry, 16k-token set would be 67M Python ints per rank as lists."""
        import numpy as np  # heavy: only where arrays are built

        if self.text_field:
            if len(dataset) != len(self.lengths):
                self.problem = (f"fms-hf-tuning's training set has {len(dataset)} rows, the dataset "
                                f"{len(self.lengths)} entries")
                self.index = None
            return
        try:
            rows = len(dataset)
            table = None if getattr(dataset, "_indices", None) is not None else dataset.data.table
            column = table.column("input_ids") if table is not None else None
        except Exception as exc:  # noqa: BLE001 - any dataset without the column
            self.problem = f"the training set has no input_ids column ({type(exc).__name__})"
            return
        if rows != len(self.lengths):
            self.problem = f"fms-hf-tuning's training set has {rows} rows, the dataset {len(self.lengths)} entries"
            return
        self.index = {}
        i = 0
        if column is None:  # a selected or shuffled view: row by row
            for row in dataset["input_ids"]:
                self.index.setdefault(self.key(row), i)
                i += 1
            return
        for chunk in column.chunks:
            offsets = chunk.offsets.to_numpy()
            flat = chunk.flatten().to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
            base = offsets[0]
            for a, b in zip(offsets[:-1], offsets[1:]):
                self.index.setdefault(hash(flat[a - base:b - base].tobytes()), i)
                i += 1

    def batch(self, examples: list[dict[str, Any]]) -> int:
        """The batch's note-3 tokens; remembers its entries until a step consumes it."""
        total, idx, images = 0, [], 0
        for e in examples:
            i = self.index.get(self.row_key(e)) if self.index is not None else None
            if i is None:
                if self.index is not None:
                    self.problem = "a batch row matched no entry of the training set"
                # fms-hf-tuning's own length (its text + EOS), named in the notes; a vision row has no ids
                total += len(e["input_ids"]) if "input_ids" in e else 0
                idx.append(-1)
            else:
                total += self.lengths[i]
                images += self.images[i]
                idx.append(i)
        self.pending.append(idx)
        self.last_images = images
        return total

    def step(self) -> None:
        if self.pending and len(self.consumed) < self.KEEP:
            self.consumed.extend(self.pending.popleft())
        elif self.pending:
            self.pending.popleft()


def _callback(ctx: Context, meter: Meter, counts: EntryCounts, stages: dict[str, Any], policy: StopPolicy,
              timeline: dict[str, Any], memory: MemoryRecorder, requested: str | None, cuda: bool) -> Any:
    inner = make_callback(ctx, meter, policy, timeline, memory)

    class FmsCallback(type(inner)):  # type: ignore[misc]
        def on_train_begin(self, args, state, control, **kw):
            if args.world_size != ctx.world_size:
                # Every rank would train on the whole dataset and the run would report world-size times the
                # work: refuse instead of measuring it.
                raise base.TrainerSetupError(
                    f"the Trainer runs {args.world_size} process(es) but the launcher started {ctx.world_size} "
                    f"({args.parallel_mode}): the ranks are not distributed; on a CPU partition pass --use_cpu True")
            loader = kw.get("train_dataloader")
            if loader is not None:
                real = getattr(loader, "base_dataloader", loader)
                counts.bind(real.dataset)
                collate = real.collate_fn

                def counting(examples: list[dict[str, Any]]) -> Any:
                    batch = collate(examples)
                    meter.pending.append((len(examples), counts.batch(examples), int(batch["input_ids"].numel()),
                                          counts.last_images))
                    return batch

                real.collate_fn = counting
            stages["model"] = kw.get("model")
            if stages["model"] is not None:  # what the release loaded and runs, beside what the point asked
                ctx.record_ran(*what_ran(ctx.asked, stages["model"], args.bf16, args.fp16, cuda))
            from accelerate.state import AcceleratorState  # heavy: only where a model is trained

            dtype = str(AcceleratorState().distributed_type).split(".")[-1]
            print(f"sbench[rank {ctx.rank}]: training under {dtype}, model {type(kw.get('model')).__name__}",
                  file=sys.stderr, flush=True)
            if ctx.world_size > 1 and requested in ("FSDP", "DEEPSPEED") and dtype != requested:
                raise base.TrainerSetupError(f"distributed_backend {requested} was asked for, but the Trainer runs "
                                             f"{dtype}: refusing to measure another backend under its name")
            opened = stages.pop("open", None)  # trainer_init (model_load with releases before process_dataargs)
            if opened:
                ctx.log.end(opened)
            ctx.log.start(Stage.TRAIN)
            stages["open"] = Stage.TRAIN
            ctx.fault_at_stage(Stage.TRAIN)
            return super().on_train_begin(args, state, control, **kw)

    return FmsCallback()


def run(args: Any, ctx: Context) -> dict[str, Any]:
    doc = ctx.doc
    import torch  # heavy: only where a model is built or trained

    cuda = torch.cuda.is_available()
    doc["settings"] = {"cuda": cuda, "torch_dtype": args.torch_dtype, "bf16": args.bf16, "fp16": args.fp16,
                       "attn_implementation": "flash_attention_2" if args.use_flash_attn else "sdpa"}
    doc["device"] = device_info(ctx.local_rank)
    import tuning.sft_trainer as st  # only in the fms-hf-tuning environment
    from accelerate import PartialState  # heavy: only where a model is trained
    from transformers import AutoTokenizer  # heavy: only where a model is built or trained
    from trl import SFTTrainer  # heavy: only where a model is trained

    doc["trainer"] = {"name": "fms-hf-tuning", "packages": _versions()}
    t_imported = time.time()
    state = PartialState(cpu=not cuda)
    launch_end(ctx, t_imported)

    with ctx.log.stage(Stage.TOKENS) as info:
        ctx.fault_at_stage(Stage.TOKENS)
        cache_dir = ctx.data_dir / TOKEN_CACHE_DIR if ctx.runner.token_cache else None
        if args.dataset_image_field:
            # A vision dataset: the tokens the model sees are the processor's (text and image tokens), per entry.
            processor = load_processor(args.model_name_or_path)
            with state.main_process_first():
                vc = vision_token_counts(processor, args.training_data_path, text_field=args.dataset_text_field,
                                         image_field=args.dataset_image_field, cache_dir=cache_dir)
            counts = EntryCounts(list(vc.counts), list(vc.image_tokens), text_field=args.dataset_text_field)
            counts.bind_texts([entry_text(processor, row, args.dataset_text_field)
                               for row in open_vision_dataset(args.training_data_path)])
            summary = vc.summary()
            summary["elapsed_s"] = vc.elapsed_s
        else:
            tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
            with state.main_process_first():
                tc = dataset_token_counts(tokenizer, args.training_data_path, text_field=args.dataset_text_field,
                                          max_seq_length=args.max_seq_length, cache_dir=cache_dir)
            counts = EntryCounts(list(tc.counts))
            summary = tc.summary()
            summary["elapsed_s"] = tc.elapsed_s
        summary["cache_dir"] = str(cache_dir) if cache_dir else None
        doc["dataset_token_counts"] = summary
        info.update(summary)

    meter = Meter()
    policy = StopPolicy.of(args, ctx.runner)
    timeline: dict[str, Any] = {}
    memory = MemoryRecorder(ctx.runner.memory_every_steps, None)
    stages: dict[str, Any] = {}
    result: dict[str, Any] = {}

    # The two places sbench must sit inside the Trainer, as the sbench trainer's subclass does: FSDP on
    # CPU partitions, and counting the batch each training step consumes.
    create = SFTTrainer.create_accelerator_and_postprocess
    step = SFTTrainer.training_step

    def create_accelerator_and_postprocess(self: Any) -> None:
        create(self)
        if base.enable_cpu_fsdp(self):
            ctx.note("FSDP on CPU: accelerate's state only enables FSDP for accelerator devices; switched the "
                     "MULTI_CPU state to FSDP (gloo) as accelerate.yaml asks")

    def training_step(self: Any, model: Any, inputs: Any, *a: Any, **kw: Any) -> Any:
        meter.consumed(inputs)
        counts.step()
        return step(self, model, inputs, *a, **kw)

    # Patching the class is the point (fms-hf-tuning builds its own SFTTrainer), which mypy refuses for methods.
    SFTTrainer.create_accelerator_and_postprocess = create_accelerator_and_postprocess  # type: ignore[method-assign]
    SFTTrainer.training_step = training_step  # type: ignore[method-assign]

    if hasattr(st, "process_dataargs"):  # 2.x before process_dataargs: model_load runs up to the first step
        process = st.process_dataargs

        def process_dataargs(*a: Any, **kw: Any) -> Any:
            if stages.pop("open", None) == Stage.MODEL_LOAD:
                ctx.log.end(Stage.MODEL_LOAD)
            ctx.log.start(Stage.DATASET)
            stages["open"] = Stage.DATASET
            ctx.fault_at_stage(Stage.DATASET)
            out = process(*a, **kw)
            ctx.log.end(Stage.DATASET, info={"rows": len(out[0]) if out and out[0] is not None else None})
            ctx.log.start(Stage.TRAINER_INIT)
            stages["open"] = Stage.TRAINER_INIT
            return out

        st.process_dataargs = process_dataargs
    train = st.train
    callback = _callback(ctx, meter, counts, stages, policy, timeline, memory, args.distributed_backend, cuda)

    def train_with_sbench(*a: Any, **kw: Any) -> Any:
        kw["additional_callbacks"] = [*(kw.get("additional_callbacks") or []), callback]
        try:
            out = train(*a, **kw)
        except BaseException as exc:
            result["error"] = exc  # fms-hf-tuning's main() turns it into sys.exit(code)
            raise
        result["trainer"] = out[0] if isinstance(out, tuple) else out
        return out

    st.train = train_with_sbench
    # fms-hf-tuning appends its own account of a failure to $TERMINATION_LOG_FILE, else ./error.log
    # (wherever the job was started): keep it in the job directory, per rank.
    os.environ["TERMINATION_LOG_FILE"] = str(ctx.paths.root / f"termination.{ctx.rank}.log") if ctx.paths \
        else os.devnull
    if ctx.world_size > 1:
        os.environ.setdefault("FSDP_USE_ORIG_PARAMS", str(args.fsdp_use_orig_params).lower())
    ctx.log.start(Stage.MODEL_LOAD)
    stages["open"] = Stage.MODEL_LOAD
    ctx.fault_at_stage(Stage.MODEL_LOAD)
    argv0 = sys.argv
    sys.argv = ["tuning.sft_trainer", *fms_argv(doc["argv"])]
    try:
        st.main()
    except BaseException as exc:
        err = result.get("error") or exc
        if isinstance(exc, SystemExit) and exc.code in (0, None) and "error" not in result:
            err = None
        if err is not None:
            opened = stages.pop("open", None)
            if opened:
                ctx.log.last_failed = opened
                killed = isinstance(err, Terminated) or signalled() is not None
                ctx.log.end(opened, "killed" if killed else "error",
                            f"terminated by signal {signalled()}" if signalled() is not None
                            else f"{type(err).__name__}: {err}"[:2000])
            if isinstance(err, SystemExit):
                raise RuntimeError(f"fms-hf-tuning exited with code {err.code} before training (see "
                                   "train.<host>.log)") from None
            raise err from None
    finally:
        sys.argv = argv0
    trainer = result.get("trainer")
    if trainer is None:
        raise RuntimeError("fms-hf-tuning's train() returned no trainer")
    m = measurements(timeline, policy, trainer.state.max_steps if args.max_steps > 0 else -1)
    if m.get("metrics"):
        run_totals(m["metrics"], ctx.world_size, trainer.args.device)
    m["memory"] = memory.snaps
    m["training_loss"] = None
    hist = trainer.state.log_history
    final: dict[str, Any] = next((h for h in reversed(hist) if "train_runtime" in h), {})
    m["hf_metrics"] = dict(final)
    m["training_loss"] = final.get("train_loss")
    m["meter"] = {"mismatches": meter.mismatches, "unconsumed_batches": len(meter.pending)}
    # Which entries this rank's steps consumed (file positions): fms-hf-tuning seeds every rank apart
    # (set_seed(device_specific=True)), so ranks may draw the same entry in one epoch; this shows it.
    m["entries_consumed"] = counts.consumed
    if counts.problem:
        ctx.note(f"dataset tokens: {counts.problem}; those rows count fms-hf-tuning's own token length")
    doc.update(m)
    model = stages.get("model") or trainer.model
    params = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    base_model = model.get_base_model() if hasattr(model, "get_base_model") else model
    doc["model"] = {"source": args.model_name_or_path, "class": type(base_model).__name__, "parameters": params,
                    "trainable_parameters": trainable, "peft_method": args.peft_method}
    doc["flops"] = {**model_counts(model, base_model.config),
                    "gradient_checkpointing": bool(args.gradient_checkpointing)}
    acc = trainer.accelerator
    doc["distributed"] = {"distributed_type": str(acc.distributed_type).split(".")[-1],
                          "num_processes": acc.num_processes, "backend": backend_name(),
                          "fsdp_version": getattr(getattr(acc.state, "fsdp_plugin", None), "fsdp_version", None),
                          "requested": args.distributed_backend, "zero_stage": None, **wrapping(trainer)}
    policy.record(doc, args, ctx)
    if stages.pop("open", None) == Stage.TRAIN:
        ctx.log.end(Stage.TRAIN, info={"global_step": m["global_step"], "stopped_by": m["stopped_by"],
                                   "train_runtime": (m.get("metrics") or {}).get("train_runtime")})
    if ctx.rank == 0 and ctx.paths is not None:
        write_json(ctx.paths.log_history, hist)
    return doc


if __name__ == "__main__":
    rank.exit_now(rank.main(run))
