"""Proof on a real GPU: sbench end to end on one NVIDIA GPU, and whether each GPU measurement is right.

``bench/gpu_check.sh`` drives it (docs/gpu-check.md); it can also run by itself once sbench's dependencies
import. On a machine whose local inventory finds a GPU through NVML it

1. builds a random Llama of 1.1B parameters on the GPU (``sbench model tiny --size 1b``) and a dataset
   (``sbench dataset generate``), both local;
2. runs four campaigns with the local executor, one after the other (:data:`POINTS`): full fine-tuning in bf16
   with a point whose batch is far past the memory prediction (it must run out of GPU memory), LoRA at two batch
   sizes, prompt tuning, and LoRA stopped by the precision auto-stop; each point trains for about 20 s;
3. collects them into DuckDB and reads the database back (``harness.db.store``), one row per point;
4. writes ``gpu_check.json`` (every point's figures and every check) and prints a table and the checks;
5. exits 1 when a check fails, naming each (2 on bad arguments).

``--rehearse`` runs the same campaigns with the tiny model on the CPU in about two minutes: the harness path is
the same, the checks that need a GPU are skipped (and listed), the out-of-memory point's error is injected
(``SBENCH_FAULT``), and CPU-only facts are checked in their place (the dtype adjustment is recorded).

    python bench/gpu_check.py --out OUT [--work DIR] [--rehearse] [--deadline-s S]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from harness.db.store import open_store  # noqa: E402
from harness.runner.devices import triton_build_problem  # noqa: E402
from harness.runner.envcapture import nvml_versions  # noqa: E402
from harness.spec.flops import peak_tflops  # noqa: E402
from harness.spec.inventory import local_inventory  # noqa: E402

FULL, LORA, PT = "finetune_full_benchmark-v1.0.0", "finetune_lora_benchmark-v1.0.0", "finetune_pt_benchmark-v1.0.0"
MODEL_NAME = "gpu-check-model"
AUTO_STOP = "WARMUP_60S_STABLE_120S_OR_10_STEPS"
MAX_LOGS = 16 * 2**20  # the job dirs' tarball: brought back from the lent machine with the rest of --out
ENERGY_TOLERANCE = 0.15  # energy against mean power x window
MFU_RANGE = (0.05, 0.85)  # of the device's bf16 peak (harness/spec/gpu_peaks.yaml)
MEMORY_TOLERANCE = 0.25  # predicted total against the measured CUDA peak (full and LoRA)


@dataclass(frozen=True)
class Profile:
    """The sizes of one run of the check: on a GPU, or rehearsed on the CPU."""

    name: str
    model_size: str  # sbench model tiny --size
    dataset_id: str
    entries: int  # the dataset's entries (a file of its own, used as is)
    seq: int  # model_max_length: every entry of the dataset is at least this long, so no batch is padded short
    batch: int  # full, prompt tuning, the precision point, the first LoRA point
    lora_batch: int  # the second LoRA point
    oom_batch: int  # far past the prediction
    train_s: float  # stop_after_seconds of each point
    precision_max_s: float  # the precision point's max_seconds
    rel_ci: float
    sample_interval_s: float
    memory_every_steps: int
    point_time: str  # each point's time limit (the local executor's timeout)
    submit_timeout_s: float  # one campaign's submit --wait


GPU = Profile(name="gpu", model_size="1b", dataset_id="news-chars-2048-entries-4096", entries=512, seq=768,
              batch=8, lora_batch=16, oom_batch=512, train_s=20.0, precision_max_s=30.0, rel_ci=0.02,
              sample_interval_s=0.5, memory_every_steps=10, point_time="00:04:00", submit_timeout_s=420.0)
REHEARSAL = Profile(name="rehearse", model_size="tiny", dataset_id="news-chars-512-entries-4096", entries=128,
                    seq=384, batch=4, lora_batch=8, oom_batch=64, train_s=2.0, precision_max_s=8.0, rel_ci=0.05,
                    sample_interval_s=0.25, memory_every_steps=5, point_time="00:03:00", submit_timeout_s=240.0)


@dataclass(frozen=True)
class Point:
    """One point of the check: its campaign, experiment and batch, and what it must show."""

    name: str
    campaign: str
    experiment: str
    batch: Callable[[Profile], int]
    expect: str = "ok"  # the run's outcome
    memory: bool = False  # its predicted memory is checked against the measured peak
    precision: bool = False  # stopped by the precision auto-stop


POINTS = (
    Point("full-bf16", "gpu-check-full", FULL, lambda p: p.batch, memory=True),
    Point("full-oom", "gpu-check-full", FULL, lambda p: p.oom_batch, expect="invalid"),
    Point("lora-small", "gpu-check-lora", LORA, lambda p: p.batch, memory=True),
    Point("lora-large", "gpu-check-lora", LORA, lambda p: p.lora_batch, memory=True),
    Point("prompt-tuning", "gpu-check-pt", PT, lambda p: p.batch),
    Point("lora-precision", "gpu-check-precision", LORA, lambda p: p.batch, precision=True),
)


def campaigns() -> list[str]:
    return list(dict.fromkeys(p.campaign for p in POINTS))


def sweep_doc(campaign: str, prof: Profile, model: Path, data_dir: Path) -> dict[str, Any]:
    """The sweep of one campaign of the check."""
    points = [p for p in POINTS if p.campaign == campaign]
    first = points[0]
    entity: dict[str, Any] = {
        "model_name": MODEL_NAME, "model_max_length": prof.seq, "dataset_id": prof.dataset_id, "number_gpus": 1,
        "torch_dtype": "bfloat16", "bf16": True, "gradient_checkpointing": False, "gradient_accumulation_steps": 1,
        "max_steps": 1_000_000}
    runner: dict[str, Any] = {"sample_interval_s": prof.sample_interval_s,
                              "memory_every_steps": prof.memory_every_steps}
    if first.precision:
        entity["auto_stop_method"] = AUTO_STOP
        runner["auto_stop"] = {"method": "precision", "rel_ci": prof.rel_ci, "min_steps": 10,
                               "max_seconds": prof.precision_max_s}
    else:
        entity["stop_after_seconds"] = prof.train_s
    return {"campaign": campaign, "experiment": first.experiment,
            "description": f"sbench's GPU check ({prof.name}): {', '.join(p.name for p in points)}",
            "entity": entity, "grid": {"batch_size": [p.batch(prof) for p in points]},
            "model_map": {MODEL_NAME: str(model)}, "data_dir": str(data_dir), "runner": runner,
            "slurm": {"time": prof.point_time}}


# -- running ------------------------------------------------------------------------------------------------

class Log:
    """Timestamped progress on stdout (the driver tees it into --out)."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.phases: dict[str, float] = {}

    def __call__(self, text: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f} s] {text}", flush=True)

    def phase(self, name: str, t_start: float) -> None:
        self.phases[name] = round(time.monotonic() - t_start, 1)


def sbench(args: Sequence[str], log: Log, *, env: dict[str, str] | None = None, timeout: float = 600,
           check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run an sbench command from this checkout (``python -m harness``); its output goes to the log."""
    cmd = [sys.executable, "-m", "harness", *map(str, args)]
    log("$ sbench " + " ".join(map(str, args)))
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=timeout)
    for line in (proc.stdout + proc.stderr).splitlines():
        print(f"    {line}", flush=True)
    if check and proc.returncode != 0:
        last = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or [""]
        raise RuntimeError(f"sbench {args[0]} exited {proc.returncode}: {last[0][:500]}")
    return proc


def environment_report() -> dict[str, Any]:
    """Versions of what the check runs on, and what torch sees (in a child process: this one never touches
    CUDA, so it holds no GPU memory while the points run)."""
    code = r"""
import importlib.metadata as md, json, sys
out = {"python": sys.version.split()[0], "packages": {}}
for n in ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "huggingface-hub", "tokenizers",
          "pyarrow", "pandas", "duckdb", "submitit", "orjson", "nvidia-ml-py", "flash-attn", "numpy", "fsspec",
          "triton"):
    try:
        out["packages"][n] = md.version(n)
    except md.PackageNotFoundError:
        out["packages"][n] = None
import torch
out["torch_cuda"] = torch.version.cuda
out["cuda_available"] = torch.cuda.is_available()
out["device_count"] = torch.cuda.device_count() if out["cuda_available"] else 0
out["import_errors"] = {}
for stmt in ("import duckdb", "import orjson", "import submitit", "import pandas", "import datasets",
             "from datasets import Dataset, Features, Image, List, Value", "import pynvml", "import peft",
             "import accelerate", "from transformers import AutoModelForCausalLM, AutoTokenizer",
             "from trl import SFTConfig, SFTTrainer"):
    try:
        exec(stmt)
    except Exception as exc:
        out["import_errors"][stmt] = f"{type(exc).__name__}: {exc}"[:500]
from harness.runner.devices import flash_attn_problem
out["flash_attn_problem"] = flash_attn_problem() if out["cuda_available"] else None
print(json.dumps(out))
"""
    path = os.pathsep.join(x for x in (str(ROOT), os.environ.get("PYTHONPATH")) if x)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": path})
    if proc.returncode != 0:
        return {"error": proc.stderr.strip()[-2000:]}
    # trl's loss runs Triton kernels on CUDA; where Triton cannot build them the trainer uses trl's torch path
    return {**json.loads(proc.stdout), "triton_build_problem": triton_build_problem()}


def device_report() -> dict[str, Any]:
    """The local inventory's partition (NVML's GPUs, else the CPU) and the peaks table's figure for it."""
    part = next(iter(local_inventory().partitions.values()))
    peak, source = (None, "cpu partition") if part.is_cpu else peak_tflops(part.gpu_model, "bf16")
    return {"gpu_model": part.gpu_model, "cpu_partition": part.is_cpu, "gpus_per_node": part.gpus_per_node,
            "cpus": part.cpus_per_node, "memory_gb": part.memory_gb, "bf16_peak_tflops": peak, "peak_source": source,
            **nvml_versions()}


def prepare_inputs(prof: Profile, work: Path, log: Log) -> tuple[Path, Path]:
    """The model (built once per size, kept in *work*) and the dataset file (no sidecar: used as is)."""
    model = work / "cache" / f"model-{prof.model_size}"
    t = time.monotonic()
    sbench(["model", "tiny", "--size", prof.model_size, "--device", "cuda" if prof is GPU else "cpu", "-o", model,
            "--if-missing"], log)
    log.phase("model", t)
    t = time.monotonic()
    gen = work / "cache" / "generated" / f"{prof.dataset_id}.jsonl"
    data = work / "data"
    if not gen.is_file():
        sbench(["dataset", "generate", prof.dataset_id, "-o", gen, "--entries", prof.entries], log)
    data.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(gen, data / gen.name)  # without the .meta.json: an external file, used as is
    log.phase("dataset", t)
    return model, data


def campaign_budget(name: str, prof: Profile) -> float:
    """Seconds one campaign needs at most: each point's training and about 25 s of start-up, model load and
    teardown."""
    return sum((prof.precision_max_s if p.precision else prof.train_s) + 25.0 for p in POINTS if p.campaign == name)


def run_campaigns(prof: Profile, work: Path, model: Path, data: Path, db: Path, runs: Path, log: Log,
                  deadline: float | None = None) -> dict[str, int | str]:
    """Submit each campaign and wait for it (one at a time: the GPU runs one point at a time); their exit codes.
    Past *deadline* (a ``time.monotonic()`` reading), a campaign that would not finish is not started, and one
    still running is cancelled: what ran is collected and checked, so a slow machine still brings its results back
    within its time limit."""
    sweeps = work / "sweeps"
    sweeps.mkdir(parents=True, exist_ok=True)
    codes: dict[str, int | str] = {}
    for name in campaigns():
        path = sweeps / f"{name}.yaml"
        path.write_text(yaml.safe_dump(sweep_doc(name, prof, model, data), sort_keys=False))
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left < campaign_budget(name, prof):
            codes[name] = f"not run: {left:.0f} s left before the deadline, it needs about " \
                          f"{campaign_budget(name, prof):.0f} s"
            log(f"campaign {name} {codes[name]}")
            continue
        env = {}
        oom = next((p for p in POINTS if p.campaign == name and p.expect == "invalid"), None)
        if oom is not None and prof is REHEARSAL:
            # No GPU to run out of: the same error, raised where a real one would be (the end of step 1).
            env["SBENCH_FAULT"] = f"oom@step=1,batch={oom.batch(prof)}"
        t = time.monotonic()
        try:
            proc = sbench(["submit", path, "--executor", "local", "--wait", "--workdir", runs, "--db", db], log,
                          env=env, timeout=prof.submit_timeout_s if left is None else min(prof.submit_timeout_s, left),
                          check=False)
            codes[name] = proc.returncode
        except subprocess.TimeoutExpired:
            codes[name] = "cancelled: past the deadline"
            log(f"campaign {name} {codes[name]}")
            sbench(["cancel", "--campaign", name, "--workdir", runs, "--db", db], log, timeout=60, check=False)
        log.phase(f"campaign {name}", t)
    if runs.is_dir():  # nothing was submitted when no campaign started
        t = time.monotonic()
        sbench(["collect", "--workdir", runs, "--db", db], log, timeout=300)
        log.phase("collect", t)
    return codes


# -- reading back -------------------------------------------------------------------------------------------

COLUMNS = (
    "outcome", "reason", "stopped_by", "global_step", "job_dir", "dataset_tokens_per_second", "dataset_tokens",
    "mfu", "peak_tflops", "model_tflops_per_gpu", "gpu_compute_utilization_avg", "gpu_memory_utilization_avg",
    "gpu_memory_utilization_peak", "gpu_power_watts_avg", "energy_joules", "energy_source",
    "dataset_tokens_per_joule", "window_s", "window_steps", "ci_rel_halfwidth", "gpu_devices", "gpu_samples",
    "memory_peak_bytes", "predicted_total_bytes", "activation_bytes", "predicted_activation_bytes",
    "effective_torch_dtype", "attn_implementation", "adjustments", "gpu_sample_rows", "train_runtime")


def read_points(db: Path, prof: Profile) -> dict[str, dict[str, Any]]:
    """Each point's run (the latest attempt) with its measurement, from the results database."""
    sql = """
        with latest as (
            select r.*, p.batch_size, row_number() over (partition by r.campaign, r.point_id
                                                         order by r.attempt desc) as k
            from runs r join points p using (point_id) where r.campaign in (select unnest(?)))
        select l.campaign, l.batch_size, l.outcome, l.reason, l.stopped_by, l.global_step, l.job_dir,
               m.dataset_tokens_per_second, m.dataset_tokens, m.mfu, m.peak_tflops, m.model_tflops_per_gpu,
               m.gpu_compute_utilization_avg, m.gpu_memory_utilization_avg, m.gpu_memory_utilization_peak,
               m.gpu_power_watts_avg, m.energy_joules, m.energy_source, m.dataset_tokens_per_joule, m.window_s,
               m.window_steps, m.ci_rel_halfwidth, m.gpu_devices, m.gpu_samples, m.memory_peak_bytes,
               m.predicted_total_bytes, m.activation_bytes, m.predicted_activation_bytes, m.effective_torch_dtype,
               m.attn_implementation, m.adjustments, m.train_runtime,
               (select count(*) from samples s where s.run_id = l.run_id and s.kind = 'gpu') as gpu_sample_rows
        from latest l left join measurements m using (run_id) where l.k = 1"""
    with open_store(db, read_only=True) as store:
        rows = store.fetch_dicts(sql, [campaigns()])
    out: dict[str, dict[str, Any]] = {}
    for p in POINTS:
        row = next((r for r in rows if r["campaign"] == p.campaign and r["batch_size"] == p.batch(prof)), None)
        if row is not None:
            if isinstance(row.get("adjustments"), str):
                row["adjustments"] = json.loads(row["adjustments"])
            row["rank0"] = _rank0(row.get("job_dir"))
            out[p.name] = row
    return out


def _rank0(job_dir: Any) -> dict[str, Any]:
    """What rank 0 ran with and how it stopped (``rank.0.json``: ran, settings, window)."""
    try:
        doc = json.loads((Path(str(job_dir)) / "rank.0.json").read_text())
    except (OSError, ValueError, TypeError):
        return {}
    return {k: doc.get(k) for k in ("ran", "settings", "window", "stopped_by", "device", "adjustments", "auto_stop")}


# -- checks -------------------------------------------------------------------------------------------------

@dataclass
class Check:
    name: str
    what: str
    status: str = "pass"  # pass | fail | skipped
    detail: list[str] = field(default_factory=list)

    def fail(self, text: str) -> None:
        self.status = "fail"
        self.detail.append(text)

    def note(self, text: str) -> None:
        self.detail.append(text)

    def skip(self, why: str) -> Check:
        self.status, self.detail = "skipped", [why]
        return self


def _each(c: Check, rows: dict[str, dict[str, Any]], want: Callable[[Point], bool] = lambda p: p.expect == "ok",
          ) -> Iterator[tuple[Point, dict[str, Any]]]:
    """The points *want* picks (by default those that train to the end) with their rows; one without a run
    fails the check, by name."""
    for p in POINTS:
        if not want(p):
            continue
        r = rows.get(p.name)
        if r is None:
            c.fail(f"{p.name}: no run in the database")
            continue
        yield p, r


def _pct(x: float) -> str:
    return f"{100 * x:+.1f} %"


def check_points_ran(rows: dict[str, dict[str, Any]]) -> Check:
    c = Check("points_ran", "every point ran to its expected outcome and measured a throughput")
    for p, r in _each(c, rows, lambda p: True):
        if r["outcome"] != p.expect:
            c.fail(f"{p.name}: outcome {r['outcome']} ({r.get('reason')}), expected {p.expect}")
        elif p.expect == "ok" and not (r.get("dataset_tokens_per_second") or 0) > 0:
            c.fail(f"{p.name}: dataset_tokens_per_second {r.get('dataset_tokens_per_second')}")
    return c


def check_nvml(rows: dict[str, dict[str, Any]], gpu: bool) -> Check:
    c = Check("nvml_samples", "NVML samples were taken on every point (and inside every measured window)")
    if not gpu:
        return c.skip("no NVIDIA GPU: the sampler has no NVML device to read")
    for p, r in _each(c, rows, lambda p: True):
        if not r.get("gpu_sample_rows"):
            c.fail(f"{p.name}: no GPU sample rows")
        elif p.expect == "ok" and not (r.get("gpu_samples") or 0) > 0:
            c.fail(f"{p.name}: {r.get('gpu_sample_rows')} GPU rows, none inside the measured window")
        else:
            c.note(f"{p.name}: {r.get('gpu_sample_rows')} GPU rows, {r.get('gpu_samples') or 0} in the window")
    return c


def check_energy(rows: dict[str, dict[str, Any]], gpu: bool) -> Check:
    c = Check("energy", f"energy is positive and within {ENERGY_TOLERANCE:.0%} of mean power x window")
    if not gpu:
        return c.skip("no NVIDIA GPU: no NVML energy counter (RAPL on a CPU node is not what is checked)")
    for p, r in _each(c, rows):
        e, w, s = r.get("energy_joules"), r.get("gpu_power_watts_avg"), r.get("window_s")
        if not e or e <= 0 or r.get("energy_source") != "nvml":
            c.fail(f"{p.name}: energy_joules {e} (source {r.get('energy_source')})")
            continue
        if not w or not s:
            c.fail(f"{p.name}: mean power {w} W over {s} s: nothing to compare with")
            continue
        dev = e / (w * s) - 1
        line = f"{p.name}: {e:.0f} J against {w:.1f} W x {s:.1f} s = {w * s:.0f} J ({_pct(dev)})"
        (c.fail if abs(dev) > ENERGY_TOLERANCE else c.note)(line)
    return c


def check_mfu(rows: dict[str, dict[str, Any]], device: dict[str, Any], gpu: bool) -> Check:
    lo, hi = MFU_RANGE
    c = Check("mfu", f"MFU is between {lo:.0%} and {hi:.0%} of the device's bf16 peak (gpu_peaks.yaml)")
    if not gpu:
        return c.skip("no NVIDIA GPU: a CPU partition has no peak unless its inventory gives one")
    peak = device.get("bf16_peak_tflops")
    if not peak or device.get("peak_source") != "gpu_peaks.yaml":
        c.fail(f"no bf16 peak for {device.get('gpu_model')} in harness/spec/gpu_peaks.yaml")
        return c
    for p, r in _each(c, rows):
        mfu, used = r.get("mfu"), r.get("peak_tflops")
        if mfu is None:
            c.fail(f"{p.name}: no MFU")
            continue
        line = f"{p.name}: MFU {100 * mfu:.1f} % ({r.get('model_tflops_per_gpu') or 0:.0f} of {used} TFLOP/s)"
        if used != peak:
            c.fail(f"{line}: the run used peak {used}, the table says {peak}")
        else:
            (c.fail if not lo <= mfu <= hi else c.note)(line)
    return c


def check_memory(rows: dict[str, dict[str, Any]], gpu: bool) -> Check:
    c = Check("memory_prediction", f"predicted memory within {MEMORY_TOLERANCE:.0%} of the measured CUDA peak "
                                   "(full and LoRA)")
    if not gpu:
        return c.skip("no NVIDIA GPU: the CPU has no allocator peak to compare with")
    for p, r in _each(c, rows, lambda p: p.memory):
        peak, pred = r.get("memory_peak_bytes"), r.get("predicted_total_bytes")
        if not peak or not pred:
            c.fail(f"{p.name}: measured peak {peak}, predicted {pred}")
            continue
        err = pred / peak - 1
        line = f"{p.name}: predicted {pred / 1e9:.2f} GB, measured peak {peak / 1e9:.2f} GB ({_pct(err)})"
        acts, pacts = r.get("activation_bytes"), r.get("predicted_activation_bytes")
        if acts and pacts:
            line += f"; activations predicted {pacts / 1e9:.2f} GB, measured {acts / 1e9:.2f} GB"
        (c.fail if abs(err) > MEMORY_TOLERANCE else c.note)(line)
    return c


OOM_TEXT = ("OutOfMemoryError", "CUDA out of memory")


def check_oom(rows: dict[str, dict[str, Any]], gpu: bool) -> Check:
    c = Check("oom", "the point far past the prediction is invalid, with a CUDA out-of-memory error as its reason")
    for p, r in _each(c, rows, lambda p: p.expect == "invalid"):
        reason = str(r.get("reason") or "")
        if r.get("outcome") != "invalid" or not any(t in reason for t in OOM_TEXT):
            c.fail(f"{p.name}: outcome {r.get('outcome')}, reason {reason[:300]!r}")
        else:
            c.note(f"{p.name}: invalid: {reason[:200]}")
        if not gpu:
            c.note("rehearsal: the error was injected (SBENCH_FAULT), not a real CUDA allocation failure")
    return c


def check_bf16(rows: dict[str, dict[str, Any]], gpu: bool) -> Check:
    c = Check("bf16", "bf16 points ran as bf16: weights in bfloat16 and the Trainer's bf16 on")
    if not gpu:
        return c.skip("no CUDA device: the trainer runs float32 on the CPU (see cpu_adjustments)")
    for p, r in _each(c, rows):
        ran = (r.get("rank0") or {}).get("ran") or {}
        if r.get("effective_torch_dtype") != "bfloat16" or ran.get("bf16") is not True:
            c.fail(f"{p.name}: weights {r.get('effective_torch_dtype')}, Trainer bf16 {ran.get('bf16')}")
        else:
            c.note(f"{p.name}: bfloat16, bf16 on")
    return c


def check_cpu_adjustments(rows: dict[str, dict[str, Any]], gpu: bool) -> Check:
    c = Check("cpu_adjustments", "on the CPU, the change from bfloat16 to float32 is recorded with its reason")
    if gpu:
        return c.skip("a GPU run: bf16 is checked instead")
    for p, r in _each(c, rows):
        adj = [a for a in r.get("adjustments") or [] if a.get("setting") == "torch_dtype"]
        if r.get("effective_torch_dtype") != "float32" or not adj or adj[0].get("why") != "no CUDA device":
            c.fail(f"{p.name}: ran {r.get('effective_torch_dtype')}, adjustments {adj}")
    return c


ATTENTION = ("flash_attention_2", "sdpa")


def check_attention(rows: dict[str, dict[str, Any]], gpu: bool) -> Check:
    c = Check("attention", "flash or sdpa attention ran, as recorded (a flash request that fell back says why)")
    for p, r in _each(c, rows):
        ran = (r.get("rank0") or {}).get("ran") or {}
        got = r.get("attn_implementation")
        if got not in ATTENTION or ran.get("attn_implementation") != got:
            c.fail(f"{p.name}: measurements say {got}, rank 0 ran {ran.get('attn_implementation')}")
            continue
        adj = [a for a in r.get("adjustments") or [] if a.get("setting") == "attn_implementation"]
        if adj and not adj[0].get("why"):
            c.fail(f"{p.name}: {adj[0].get('asked')} -> {got} without a reason")
        c.note(f"{p.name}: {got}" + (f" (asked {adj[0].get('asked')}: {adj[0].get('why')})" if adj else ""))
    return c


def check_precision(rows: dict[str, dict[str, Any]], gpu: bool, prof: Profile) -> Check:
    c = Check("precision_stop", "the precision point stopped once its throughput's 95 % interval was narrow enough")
    for p, r in _each(c, rows, lambda p: p.precision):
        rank0 = r.get("rank0") or {}
        window, ci, rule = rank0.get("window"), r.get("ci_rel_halfwidth"), (rank0.get("auto_stop") or {}).get("rule")
        line = (f"{p.name}: stopped by {r.get('stopped_by')} after {r.get('global_step')} steps, window {window} of "
                f"{r.get('window_steps')} steps, interval "
                + ("none" if ci is None else f"+-{100 * ci:.2f} % (asked +-{100 * prof.rel_ci:g} %)"))
        if gpu:
            ok = (r.get("stopped_by") == "precision" and window == "steady_state" and ci is not None
                  and ci <= prof.rel_ci)
        else:
            # A shared CPU's step times may not settle within max_seconds: the rule and its stop are what is checked.
            ok = rule == "precision" and r.get("stopped_by") in ("precision", "max_seconds") and \
                (r.get("window_steps") or 0) > 0
        (c.note if ok else c.fail)(line)
        if not gpu:
            c.note("rehearsal: the rule ran and stopped the point; on a shared CPU it may stop at max_seconds")
    return c


def run_checks(rows: dict[str, dict[str, Any]], device: dict[str, Any], prof: Profile) -> list[Check]:
    gpu = prof is GPU
    return [check_points_ran(rows), check_nvml(rows, gpu), check_energy(rows, gpu), check_mfu(rows, device, gpu),
            check_memory(rows, gpu), check_oom(rows, gpu), check_bf16(rows, gpu), check_cpu_adjustments(rows, gpu),
            check_attention(rows, gpu), check_precision(rows, gpu, prof)]


# -- the summary --------------------------------------------------------------------------------------------

def point_summary(p: Point, r: dict[str, Any] | None, prof: Profile) -> dict[str, Any]:
    """One point's figures as gpu_check.json gives them."""
    doc: dict[str, Any] = {"point": p.name, "campaign": p.campaign, "experiment": p.experiment,
                           "batch_size": p.batch(prof), "expected_outcome": p.expect}
    if r is None:
        return {**doc, "outcome": None, "reason": "no run in the database"}
    peak, pred = r.get("memory_peak_bytes"), r.get("predicted_total_bytes")
    doc.update({k: r.get(k) for k in COLUMNS if k not in ("job_dir", "adjustments", "gpu_sample_rows")})
    doc.update(job_dir=Path(str(r.get("job_dir"))).name, gpu_sample_rows=r.get("gpu_sample_rows"),
               adjustments=r.get("adjustments"), ran=(r.get("rank0") or {}).get("ran"),
               window=(r.get("rank0") or {}).get("window"),
               memory_error=(pred / peak - 1) if peak and pred else None,
               energy_vs_power_window=((r["energy_joules"] / (r["gpu_power_watts_avg"] * r["window_s"]) - 1)
                                       if r.get("energy_joules") and r.get("gpu_power_watts_avg")
                                       and r.get("window_s") else None))
    return doc


def _num(v: Any, scale: float = 1.0, fmt: str = "{:.1f}") -> str:
    return "-" if v is None else fmt.format(v * scale)


def table(points: list[dict[str, Any]]) -> str:
    head = ("point", "outcome", "batch", "dataset tok/s", "MFU %", "GPU util %", "GPU mem %", "power W", "energy kJ",
            "tok/J", "peak GB", "pred GB", "pred err")
    lines = [head]
    for d in points:
        lines.append((d["point"], str(d.get("outcome")), str(d["batch_size"]),
                      _num(d.get("dataset_tokens_per_second"), fmt="{:,.0f}"), _num(d.get("mfu"), 100),
                      _num(d.get("gpu_compute_utilization_avg")), _num(d.get("gpu_memory_utilization_avg")),
                      _num(d.get("gpu_power_watts_avg"), fmt="{:.0f}"), _num(d.get("energy_joules"), 1e-3, "{:.2f}"),
                      _num(d.get("dataset_tokens_per_joule"), fmt="{:.1f}"),
                      _num(d.get("memory_peak_bytes"), 1e-9, "{:.2f}"), _num(d.get("predicted_total_bytes"), 1e-9,
                                                                              "{:.2f}"),
                      "-" if d.get("memory_error") is None else _pct(d["memory_error"])))
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
                     for row in lines)


def tar_logs(runs: Path, out: Path, log: Log) -> dict[str, Any]:
    """The job dirs (stages, samples, rank and error files, train logs) as one tarball under :data:`MAX_LOGS`;
    the samples files go first when it would be larger (the database holds their rows)."""
    dest = out / "jobdirs.tar.gz"
    files = sorted(p for p in runs.rglob("*") if p.is_file() and ".submitit" not in p.parts)
    for drop in ((), ("samples.",)):
        kept = [p for p in files if not p.name.startswith(drop)] if drop else files
        with tarfile.open(dest, "w:gz") as tar:
            for p in kept:
                tar.add(p, arcname=str(p.relative_to(runs.parent)))
        size = dest.stat().st_size
        if size <= MAX_LOGS:
            return {"path": dest.name, "bytes": size, "files": len(kept), "samples_left_out": bool(drop)}
        log(f"job dirs' tarball {size / 2**20:.1f} MiB > {MAX_LOGS / 2**20:.0f} MiB: leaving the samples files out")
    dest.unlink()
    return {"path": None, "bytes": 0, "files": 0, "note": "too large even without the samples files"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="where gpu_check.json, the database and the logs go")
    ap.add_argument("--work", type=Path, default=None,
                    help="scratch: model, dataset, job dirs (default: $TMPDIR/sbench-gpu-check-<mode>)")
    ap.add_argument("--rehearse", action="store_true", help="the tiny model on the CPU; GPU-only checks skipped")
    ap.add_argument("--deadline-s", type=float, default=None,
                    help="seconds after which no campaign starts that would not finish, and a running one is "
                         "cancelled; what ran is collected and checked (default: none)")
    args = ap.parse_args(argv)
    prof = REHEARSAL if args.rehearse else GPU
    log = Log()
    out = args.out.resolve()
    work = (args.work or Path(os.environ.get("TMPDIR", "/tmp")) / f"sbench-gpu-check-{prof.name}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    runs, db = work / "runs", work / "results.duckdb"
    for stale in (runs, work / "sweeps", work / "data"):  # a new run measures anew; the model and dataset stay
        shutil.rmtree(stale, ignore_errors=True)
    db.unlink(missing_ok=True)
    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    summary: dict[str, Any] = {"mode": prof.name, "started_at": started, "profile": asdict(prof), "work": str(work)}
    device = device_report()
    summary["device"] = device
    log(f"device: {device}")
    if not args.rehearse and device["cpu_partition"]:
        print("gpu_check: the local inventory finds no GPU through NVML (nvidia-ml-py and an NVIDIA driver); run "
              "bench/gpu_check.sh --rehearse on a machine without one", file=sys.stderr)
        return 1
    t = time.monotonic()
    summary["environment"] = environment_report()
    log(f"environment: {json.dumps(summary['environment'])}")
    log.phase("environment", t)
    broken = summary["environment"].get("import_errors") or {}
    if broken or "error" in summary["environment"]:
        for stmt, err in broken.items():
            print(f"gpu_check: {stmt}: {err}", file=sys.stderr)
        print(f"gpu_check: sbench's dependencies do not import here "
              f"({summary['environment'].get('error') or ', '.join(broken)}); see wheels.json for what was "
              "installed", file=sys.stderr)
        (out / "gpu_check.json").write_text(json.dumps({**summary, "ok": False, "failed": ["imports"]}, indent=2)
                                            + "\n")
        return 1
    if not args.rehearse and not summary["environment"].get("cuda_available"):
        env = summary["environment"]
        print(f"gpu_check: NVML sees {device['gpu_model']}, but torch does not see a CUDA device (torch "
              f"{(env.get('packages') or {}).get('torch')}, built for CUDA {env.get('torch_cuda')}; "
              f"{env.get('error') or 'is the driver older than that CUDA?'})", file=sys.stderr)
        (out / "gpu_check.json").write_text(json.dumps({**summary, "ok": False, "failed": ["cuda"]}, indent=2) + "\n")
        return 1
    wheels = out / "wheels.json"
    if wheels.is_file():
        summary["wheels"] = json.loads(wheels.read_text())
    failure = None
    try:
        model, data = prepare_inputs(prof, work, log)
        deadline = None if args.deadline_s is None else log.t0 + args.deadline_s
        summary["submit_exit_codes"] = run_campaigns(prof, work, model, data, db, runs, log, deadline)
    except (RuntimeError, subprocess.TimeoutExpired, OSError) as exc:
        failure = f"{type(exc).__name__}: {exc}"
        log(f"stopped: {failure}")
    rows = read_points(db, prof) if db.is_file() else {}
    summary["points"] = [point_summary(p, rows.get(p.name), prof) for p in POINTS]
    checks = run_checks(rows, device, prof)
    if failure:
        checks.insert(0, Check("run", "the check ran to its end", "fail", [failure]))
    summary["checks"] = [asdict(c) for c in checks]
    summary["failed"] = [c.name for c in checks if c.status == "fail"]
    summary["skipped"] = {c.name: c.detail[0] for c in checks if c.status == "skipped"}
    summary["ok"] = not summary["failed"]
    if db.is_file():
        shutil.copyfile(db, out / "results.duckdb")
    if runs.is_dir():
        summary["logs"] = tar_logs(runs, out, log)
    summary["phases_s"] = log.phases
    summary["elapsed_s"] = round(time.monotonic() - log.t0, 1)
    (out / "gpu_check.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    print()
    print(table(summary["points"]))
    print()
    for c in checks:
        print(f"{c.status.upper():8} {c.name}: {c.what}")
        for line in c.detail:
            print(f"         {line}")
    print(f"\n{prof.name}: {'all checks hold' if summary['ok'] else 'FAILED: ' + ', '.join(summary['failed'])} "
          f"({summary['elapsed_s']} s; {out / 'gpu_check.json'})")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
