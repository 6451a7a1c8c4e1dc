"""A profiled run's traces (``runner.profile``) as rows of ``profile_ops``: where its steps' time went.

:func:`summarise` reads one rank's Chrome trace (torch.profiler's, gzipped; ``harness.runner.profile`` wrote it)
and returns, for the steps it covers (the ``sbench:step`` ranges):

- the **step breakdown** (``kind = 'phase'``): every instant of a step goes to exactly one part, so the parts'
  shares add up to the step. While a collective is in flight (a communication event: NCCL or gloo kernels and
  ops, c10d collectives and their waits, on any thread or stream of the rank; a local copy around one, such as
  FSDP's ``all_gather_copy_in``/``copy_out``, is not communication, nor is FSDP's own range around the copies and
  the collective, ``FSDP::all_gather``: the collective inside it is), the instant is
  ``communication_exposed`` when the step waited for it: its own thread is inside a communication op, or does
  no recorded work at all; and ``communication_overlapped`` when the step's own thread computes meanwhile (the
  collective is hidden behind its work). On a GPU trace the same split follows Holistic Trace Analysis's
  definition on the device: a communication kernel's time is overlapped where a compute kernel runs at the same
  time, exposed where none does. Otherwise ``backward``: an autograd backward function ran; else the range of
  the step it lies in: ``data`` (loading the step's batches), ``forward`` (the rest of the forward and backward
  pass: the forward, the loss), ``optimizer`` (its step) and ``other`` (gradient clipping, the scheduler,
  zeroing, the callbacks); and ``idle``: inside the step but in none of its ranges (the step thread between
  them);
- the **top operators and kernels** by self time (``kind = 'op'`` on the CPU, ``'kernel'`` on the GPU, and
  ``'collective'``: the communication backend's own range of each collective, ``gloo:all_reduce`` or
  ``nccl:all_reduce``): calls, self time, total time (with what it called) and self time's share of the steps'
  time.
"""

from __future__ import annotations

import gzip
import io
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

PHASES = ("data", "forward", "backward", "optimizer", "communication_exposed", "communication_overlapped", "idle",
          "other")
EXPOSED, OVERLAPPED = "communication_exposed", "communication_overlapped"
REGIONS = {"sbench:data": "data", "sbench:compute": "forward", "sbench:optimizer": "optimizer",
           "sbench:other": "other"}
STEP = "sbench:step"
# A communication event's name (a collective, its backend's kernel or range, or a wait for one) ...
COMM = re.compile(r"nccl|gloo|c10d|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|\bbroadcast\b|barrier|"
                  r"wait_tensor|FSDP::\w*wait|record_param_comms", re.I)
# ... unless it is a local copy around a collective, an elementwise op that merely shares a word with one, or one of
# FSDP's own ranges (``FSDP::all_gather``, ``FSDP::post_backward_reduce``): a wrapper holding the copies in and out
# as well as the collective, whose communication is the backend's events inside it (its waits still count)
NOT_COMM = re.compile(r"copy_in|copy_out|_copy\b|broadcast_tensors|^FSDP::(?!.*wait)", re.I)
BACKWARD = "autograd::engine::evaluate_function"
TOP = 25  # operators (and kernels) kept per rank
TRACE_MAX = 2 << 30  # a trace larger than this (uncompressed) is not read: profile fewer steps


@dataclass
class Summary:
    steps: int
    step_s: float  # the steps' seconds, summed
    phases: dict[str, float]  # seconds per part of PHASES, summed over the steps
    ops: list[dict[str, Any]] = field(default_factory=list)  # kind, name, calls, self_s, total_s


def _merge(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _covered(merged: list[tuple[float, float]], a: float, b: float) -> bool:
    """Whether the elementary span [a, b] lies inside one of *merged* (sorted, disjoint)."""
    lo, hi = 0, len(merged)
    while lo < hi:
        mid = (lo + hi) // 2
        if merged[mid][1] <= a:
            lo = mid + 1
        else:
            hi = mid
    return lo < len(merged) and merged[lo][0] <= a and b <= merged[lo][1]


def is_comm(name: str) -> bool:
    """Whether an event of this name is communication (:data:`COMM`, not :data:`NOT_COMM`, not sbench's own)."""
    return not name.startswith("sbench:") and bool(COMM.search(name)) and not NOT_COMM.search(name)


def _span(e: dict[str, Any]) -> tuple[float, float]:
    return float(e["ts"]), float(e["ts"]) + float(e["dur"])


def summarise(doc: dict[str, Any]) -> Summary:
    """The step breakdown and the top operators of one rank's trace (a Chrome trace document)."""
    events = [e for e in doc.get("traceEvents") or [] if isinstance(e, dict) and e.get("ph") == "X"
              and isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur"), (int, float))]
    step_events = [e for e in events if e.get("name") == STEP]
    steps = sorted(_span(e) for e in step_events)
    step_thread = {(e.get("pid"), e.get("tid")) for e in step_events}
    regions = [(*_span(e), REGIONS[e["name"]]) for e in events if e.get("name") in REGIONS]
    kernels = [e for e in events if str(e.get("cat", "")) == "kernel"]
    comm_events = [e for e in events if is_comm(str(e.get("name", "")))]
    comm = _merge(_span(e) for e in comm_events)
    back = _merge(_span(e) for e in events if str(e.get("name", "")).startswith(BACKWARD))
    if kernels:  # a GPU trace: the device's own timeline decides (Holistic Trace Analysis's definition)
        waiting = _merge(_span(e) for e in kernels if is_comm(str(e.get("name", ""))))
        working = _merge(_span(e) for e in kernels if not is_comm(str(e.get("name", ""))))
        comm = waiting
    else:  # the step's own thread: inside a collective (or a wait for one), or running an operator meanwhile
        mine = [e for e in events if (e.get("pid"), e.get("tid")) in step_thread and str(e.get("cat", "")) == "cpu_op"]
        waiting = _merge(_span(e) for e in mine if is_comm(str(e.get("name", ""))))
        working = _merge(_span(e) for e in mine if not is_comm(str(e.get("name", ""))))
    phases = dict.fromkeys(PHASES, 0.0)
    for s0, s1 in steps:
        bounds = {s0, s1}
        inside = [(a, b, n) for a, b, n in regions if a < s1 and b > s0]
        for a, b, _ in inside:
            bounds.update((max(a, s0), min(b, s1)))
        for merged in (comm, back, waiting, working):
            for a, b in merged:
                if a < s1 and b > s0:
                    bounds.update((max(a, s0), min(b, s1)))
        cuts = sorted(bounds)
        for a, b in zip(cuts, cuts[1:]):
            if b <= a:
                continue
            if _covered(comm, a, b) or (not kernels and _covered(waiting, a, b)):
                hidden = _covered(working, a, b) and not (not kernels and _covered(waiting, a, b))
                part = OVERLAPPED if hidden else EXPOSED
            elif _covered(back, a, b):
                part = "backward"
            else:
                part = next((n for x, y, n in inside if x <= a and b <= y), "idle")
            phases[part] += (b - a) / 1e6
    step_s = sum(b - a for a, b in steps) / 1e6
    return Summary(len(steps), step_s, phases, _top_ops(events, steps))


def _top_ops(events: list[dict[str, Any]], steps: list[tuple[float, float]]) -> list[dict[str, Any]]:
    """Operators (CPU) and kernels (GPU) inside the steps, by self time: each event's duration less its direct
    children's on the same thread."""
    def in_steps(t: float) -> bool:
        return any(a <= t < b for a, b in steps)

    agg: dict[tuple[str, str], list[float]] = {}  # (kind, name) -> [calls, self us, total us]
    by_thread: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for e in events:
        cat = str(e.get("cat", ""))
        if cat == "kernel" or cat.startswith("gpu_mem"):
            if in_steps(float(e["ts"])):
                a = agg.setdefault(("kernel", str(e["name"])), [0, 0.0, 0.0])
                a[0] += 1
                a[1] += float(e["dur"])
                a[2] += float(e["dur"])
        elif cat == "cpu_op":
            by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(e)
        elif (cat.endswith("user_annotation") and is_comm(str(e.get("name", ""))) and in_steps(float(e["ts"]))
              and "wait" not in str(e["name"]).lower()):
            # a backend's own range of one collective (gloo:all_reduce on gloo's threads, nccl:all_reduce; not a
            # framework's range of a wait for one, FSDP::post_backward_rs_wait)
            a = agg.setdefault(("collective", str(e["name"])), [0, 0.0, 0.0])
            a[0] += 1
            a[1] += float(e["dur"])
            a[2] += float(e["dur"])
    for evs in by_thread.values():
        evs.sort(key=lambda e: (float(e["ts"]), -float(e["dur"])))
        stack: list[tuple[float, list[float], bool]] = []  # (end, [child us], counted)
        rows: list[tuple[dict[str, Any], list[float]]] = []
        for e in evs:
            t0, t1 = float(e["ts"]), float(e["ts"]) + float(e["dur"])
            while stack and stack[-1][0] <= t0:
                stack.pop()
            kids: list[float] = [0.0]
            if stack:
                stack[-1][1][0] += float(e["dur"])
            stack.append((t1, kids, True))
            rows.append((e, kids))
        for e, kids in rows:
            if not in_steps(float(e["ts"])):
                continue
            a = agg.setdefault(("op", str(e["name"])), [0, 0.0, 0.0])
            a[0] += 1
            a[1] += max(float(e["dur"]) - kids[0], 0.0)
            a[2] += float(e["dur"])
    out = []
    for kind in ("op", "kernel", "collective"):
        mine = sorted(((n, v) for (k, n), v in agg.items() if k == kind), key=lambda x: -x[1][1])[:TOP]
        out += [{"kind": kind, "name": n, "calls": int(v[0]), "self_s": v[1] / 1e6, "total_s": v[2] / 1e6}
                for n, v in mine]
    return out


def read_trace(data: bytes) -> dict[str, Any]:
    """A trace file's document: gzipped or plain JSON."""
    if data[:2] == b"\x1f\x8b":
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as g:
            data = g.read(TRACE_MAX + 1)
        if len(data) > TRACE_MAX:
            raise ValueError(f"larger than {TRACE_MAX >> 30} GiB uncompressed: profile fewer steps")
    doc = json.loads(data)
    if not isinstance(doc, dict):
        raise ValueError("not a Chrome trace (no traceEvents object)")
    return doc


def profile_rows(run_id: str, host: str, rank: int, s: Summary) -> list[dict[str, Any]]:
    """The ``profile_ops`` rows of one rank's summary: its parts, then its operators and kernels."""
    total = s.step_s or None
    base = {"run_id": run_id, "host": host, "rank": rank, "steps": s.steps, "step_s": s.step_s / s.steps
            if s.steps else None}
    rows = [{**base, "kind": "phase", "name": p, "calls": s.steps, "self_s": v, "total_s": v,
             "share": v / total if total else None} for p, v in s.phases.items()]
    rows += [{**base, **o, "share": o["self_s"] / total if total else None} for o in s.ops]
    return rows
