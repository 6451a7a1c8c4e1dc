"""Every sbatch script sbench submits, made by one pure function.

:func:`make_sbatch` turns an :class:`Sbatch` (directives, comment lines, body lines) into the text of
a script, in the manner of submitit's ``_make_sbatch_string``: the directives in one fixed order, each
value written so that sbatch's own reader keeps it whole; every comment made safe (nothing in it can
end its line); the body as given. The three scripts are specs for it:

- :func:`job_sbatch`: ``job.sbatch`` of every job dir, what one point runs (by hand, or in an array);
- :func:`array_sbatch` / :func:`array_script`: the array wrapper for points that share one resource shape
  (several arrays when the shape has more points than one array may hold); a task may run a pack of points
  one after another (``slurm.pack``, :func:`pack_lines`);
- :func:`feed_sbatch`: the feeder job of a campaign larger than the submit quota (``harness.campaign.executors.feed``);
- :func:`prepare_sbatch`: the preparation job of ``sbench prepare --on slurm``.

Every value these put on a shell line goes through ``shlex.quote``. Nothing here reads the disk,
the environment or the scheduler: what to run (paths, interpreter) comes in as arguments.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.contract.errors import RenderError
from harness.contract.paths import slurm_log_name
from harness.spec.inventory import Inventory
from harness.spec.plan import Sweep

from .jobspec import JobSpec, scheduling, slurm_extra

DIRECTIVE_ORDER = ("job_name", "partition", "nodes", "ntasks_per_node", "gpus_per_node", "cpus_per_task", "mem",
                   "time", "account", "qos", "constraint", "exclusive", "nodelist", "exclude", "requeue", "no_requeue",
                   "output")
PREPARE_TIME = "02:00:00"  # the preparation job's time limit unless the sweep or the partition sets one
PREPARE_CPUS = 16  # cores the preparation job asks for (the tokenizer uses them all)


@dataclass(frozen=True)
class Sbatch:
    """What an sbatch script says: its options, what it is, and what it runs."""

    directives: dict[str, Any]  # sbatch long options, '_' for '-'; True is a bare flag, None and False leave it out
    comments: Sequence[str]  # the lines after the directives, each written '# text' ('' is a bare '#')
    body: Sequence[str]  # shell lines, every value in them already quoted by whoever made them


def directive_value(key: str, value: Any) -> str:
    text = str(value)
    if any(c in text for c in "\n\r\0"):
        raise RenderError(f"sbatch option --{key.replace('_', '-')} would contain a line break: {text!r}")
    if any(c.isspace() for c in text) or '"' in text or "'" in text:
        # sbatch reads #SBATCH values with its own quote handling; double quotes keep spaces together.
        text = '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def sbatch_directives(options: dict[str, Any]) -> list[str]:
    """``--key=value`` strings in a fixed order (then the others, sorted); ``True`` becomes a bare flag."""
    keys = [k for k in DIRECTIVE_ORDER if k in options] + sorted(k for k in options if k not in DIRECTIVE_ORDER)
    out = []
    for k in keys:
        v = options[k]
        if v is None or v is False:
            continue
        flag = "--" + k.replace("_", "-")
        out.append(flag if v is True else f"{flag}={directive_value(k, v)}")
    return out


def comment_text(value: Any) -> str:
    """*value* as comment text: only a line break could end a comment, so anything but printable ASCII is '?'."""
    return re.sub(r"[^\x20-\x7e]", "?", str(value))


def make_sbatch(script: Sbatch) -> str:
    """The text of *script*: the shebang, its directives, its comments, its body."""
    lines = ["#!/bin/bash", *(f"#SBATCH {d}" for d in sbatch_directives(script.directives)),
             *(f"# {comment_text(c)}" if c else "#" for c in script.comments), *script.body]
    return "\n".join(lines) + "\n"


def job_name_of(script: str) -> str | None:
    """The job name a script :func:`make_sbatch` made asks for (``--job-name``), as sbatch reads it."""
    for line in script.splitlines():
        if line.startswith("#SBATCH --job-name="):
            return line.split("=", 1)[1].strip().strip('"')
    return None


def _q(value: Any) -> str:
    return shlex.quote(str(value))


def job_sbatch(spec: JobSpec) -> str:
    """``job.sbatch``: one task per node, each running the job dir's ``launch.sh``."""
    return make_sbatch(Sbatch(
        directives=spec.resources,
        comments=[
            "",
            f"sbench {spec.sbench_version}: campaign {spec.campaign}, point {spec.point_id}, repeat {spec.repeat}, "
            f"attempt {spec.attempt}",
            f"{spec.experiment} on partition {spec.partition}: {spec.num_machines} node(s) x "
            f"{spec.processes_per_node} process(es)",
            "Submit by hand with `sbatch job.sbatch`, or let `sbench submit` run it inside a job array.",
        ],
        body=[
            "set -euo pipefail",
            f"JOB_DIR={_q(spec.job_dir)}",
            'cd "$JOB_DIR"',
            'exec >>"$JOB_DIR/slurm-${SLURM_JOB_ID:-local}.out" 2>&1',
            'echo "sbench: job ${SLURM_JOB_ID:-?} (array ${SLURM_ARRAY_JOB_ID:-none}_${SLURM_ARRAY_TASK_ID:-none}) '
            'restart ${SLURM_RESTART_COUNT:-0} on ${SLURM_JOB_NODELIST:-?} at $(date -Is)"',
            "# One task per node; each task sources its own host's env and finds rank and rendezvous from SLURM.",
            f"srun --nodes={_q(spec.num_machines)} --ntasks-per-node=1 "
            f"--cpus-per-task={_q(spec.resources['cpus_per_task'])} --kill-on-bad-exit=1 "
            'bash "$JOB_DIR/launch.sh"',
        ]))


def array_shape(spec: JobSpec) -> dict[str, Any]:
    """The sbatch options every task of a resource shape's arrays shares (a point's own, less its name and log)."""
    return {k: v for k, v in spec.resources.items() if k not in ("job_name", "output")}


def array_name(campaign: str, spec: JobSpec) -> str:
    """The job name of the arrays of *spec*'s resource shape: ``sbench.<campaign>.<digest of the shape>``."""
    return f"sbench.{campaign}.{hashlib.sha256(repr(spec.shape()).encode()).hexdigest()[:8]}"


def array_job_name(campaign: str, specs: list[JobSpec]) -> str:
    """The job name of the array wrapper for *specs* (what sacct's answer is matched on)."""
    return array_name(campaign, specs[0])


def array_sbatch(campaign: str, specs: list[JobSpec], max_parallel: int | None, out_dir: str | Path) -> str:
    """The array wrapper for *specs* (one resource shape): task i runs the ``job.sbatch`` of job dir i."""
    return array_script(campaign, array_name(campaign, specs[0]), array_shape(specs[0]),
                        [s.job_dir for s in specs], max_parallel, out_dir)


def array_script(campaign: str, name: str, shape: dict[str, Any], job_dirs: Sequence[str | Sequence[str]],
                 max_parallel: int | None, out_dir: str | Path, requeue: str | None = None,
                 in_process: bool = False) -> str:
    """An array of one resource shape (*shape*: its sbatch options) whose task i runs the ``job.sbatch`` of
    ``job_dirs[i]``; at most *max_parallel* tasks at once. An entry that is a list of job dirs is a pack
    (``slurm.pack``): its task runs them one after another (:func:`pack_lines`; *requeue* is the command that
    puts the rest of a pack back in the queue after an OOM)."""
    n = len(job_dirs)
    directives = {**shape, "job_name": name, "array": f"0-{n - 1}" + (f"%{max_parallel}" if max_parallel else ""),
                  "output": f"{out_dir}/%A_%a.out"}
    if any(not isinstance(d, str) for d in job_dirs):
        return make_sbatch(Sbatch(
            directives=directives,
            comments=[f"sbench: {n} pack(s) of points of campaign {campaign} share this resource shape; array "
                      "task i runs", "the points of pack i below one after another, each its job.sbatch as "
                      "rendered, in this allocation."],
            body=pack_lines([[d] if isinstance(d, str) else list(d) for d in job_dirs], requeue, in_process)))
    return make_sbatch(Sbatch(
        directives=directives,
        comments=[f"sbench: {n} point(s) of campaign {campaign} share this resource shape; array task i runs",
                  "the job.sbatch of job directory i below, exactly as rendered."],
        body=["set -euo pipefail", "JOB_DIRS=(", *[f"  {_q(d)}" for d in job_dirs], ")",
              'JOB_DIR="${JOB_DIRS[$SLURM_ARRAY_TASK_ID]}"', 'exec bash "$JOB_DIR/job.sbatch"']))


def pack_lines(packs: Sequence[Sequence[str]], requeue: str | None, in_process: bool = False) -> list[str]:
    """The body of a pack array (``harness.campaign.executors.pack``): task i runs the job dirs of ``packs[i]``
    in order.

    *in_process* (the sbench trainer): the first job dir's ``job.sbatch`` runs with ``SBENCH_PACK`` naming them
    all, and its node runner and training processes run every point in turn in one training process; the
    points it did not reach (no stages file: a point before them did not end ok) go to *requeue*, the shell
    function that submits them as their own jobs. Otherwise each job dir's ``job.sbatch`` runs in turn,
    skipping one ``sbench cancel`` marked; once one ends invalid (GPU out of memory: its result file says so),
    the rest go to *requeue*; a point that fails otherwise does not stop the others. The job ends 0: each
    point's files say how it went."""
    cases = [f"  {i}) JOB_DIRS=({' '.join(_q(d) for d in dirs)}) ;;" for i, dirs in enumerate(packs)]
    head = ["set -uo pipefail",
            'case "$SLURM_ARRAY_TASK_ID" in', *cases,
            '  *) echo "sbench: no pack $SLURM_ARRAY_TASK_ID" >&2; exit 1 ;;', "esac",
            *(requeue.splitlines() if requeue else [])]
    if in_process:
        packs_json = [_q(json.dumps(list(dirs))) for dirs in packs]
        jcases = [f"  {i}) export SBENCH_PACK={j} ;;" for i, j in enumerate(packs_json)]
        return [
            *head,
            'case "$SLURM_ARRAY_TASK_ID" in', *jcases, "esac",
            'echo "sbench: pack: ${#JOB_DIRS[@]} points in one training process from ${JOB_DIRS[0]} at $(date -Is)"',
            'bash "${JOB_DIRS[0]}/job.sbatch" || echo "sbench: pack: ended with status $?"',
            "unset SBENCH_PACK",
            "REST=()",
            'for JOB_DIR in "${JOB_DIRS[@]}"; do',
            '  compgen -G "$JOB_DIR/stages.*.jsonl" >/dev/null || REST+=("$JOB_DIR")',
            "done",
            'if [ ${#REST[@]} -gt 0 ]; then',
            '  echo "sbench: pack: ${#REST[@]} point(s) not reached go back to the queue as their own jobs"',
            *(['  sbench_requeue "${REST[@]}"'] if requeue else []),
            "fi",
            "exit 0",
        ]
    rest = '"${JOB_DIRS[@]:$((i + 1))}"'
    return [
        *head,
        "for ((i = 0; i < ${#JOB_DIRS[@]}; i++)); do",
        '  JOB_DIR="${JOB_DIRS[$i]}"',
        '  if grep -qs \'"cancelled_at": "\' "$JOB_DIR/submitted.json"; then',
        '    echo "sbench: pack: $JOB_DIR was cancelled with sbench cancel; not run"; continue',
        "  fi",
        '  echo "sbench: pack: point $((i + 1)) of ${#JOB_DIRS[@]}: $JOB_DIR at $(date -Is)"',
        '  bash "$JOB_DIR/job.sbatch" || echo "sbench: pack: $JOB_DIR ended with status $?"',
        '  if [ $((i + 1)) -lt ${#JOB_DIRS[@]} ] && grep -qs \'"outcome": "invalid"\' "$JOB_DIR"/result.*.json; then',
        '    echo "sbench: pack: $JOB_DIR ran out of GPU memory; the rest go back to the queue as their own jobs"',
        *([f"    sbench_requeue {rest}"] if requeue else []),
        "    break",
        "  fi",
        "done",
        "exit 0",
    ]


def requeue_command(inv: Inventory, sweep: Sweep, python: str, cwd: str, campaign_dir: str | Path, module: str) -> str:
    """The shell function ``sbench_requeue JOB_DIR...`` a pack calls to put its points still to run back in the
    queue: ``python -m MODULE requeue`` (the executor's pack module names itself) under the inventory's and the
    partition's setup lines, in a subshell."""
    part = inv.partition(sweep.partition)
    lines = ["sbench_requeue() (", f"  cd {_q(cwd)}", *(f"  {line}" for line in (*inv.setup, *part.setup)),
             f'  exec {_q(python)} -m {module} requeue {_q(campaign_dir)} "$@"', ")"]
    return "\n".join(lines)


FEED_TIME = "00:10:00"  # the feeder job's time limit: it submits a wave and resubmits itself, in seconds


def feed_sbatch(sweep: Sweep, inv: Inventory, argv: list[str], cwd: str, out_dir: str | Path,
                slurm_partition: str | None = None) -> str:
    """The feeder job: one small task (one core) that runs *argv* (``harness.campaign.executors.feed``) to submit
    the next wave of a campaign larger than the submit quota. It runs on *slurm_partition* (the sweep's
    ``slurm.feed_partition``), else on the sweep's partition, under the sweep's account and QOS."""
    part = inv.partition(sweep.partition)
    options: dict[str, Any] = {
        "job_name": f"sbench.{sweep.campaign}.feed", "partition": slurm_partition or part.slurm_partition,
        "nodes": 1, "ntasks": 1, "cpus_per_task": 1, "mem": "1G", "time": FEED_TIME,
        **{k: v for k, v in scheduling(sweep, part).items() if k != "constraint"}}
    options["output"] = f"{out_dir}/{slurm_log_name('feed', '%j')}"
    return make_sbatch(Sbatch(
        directives=options,
        comments=["sbench: submit the next wave of this campaign's held attempts when the submit quota has room,",
                  "then submit this script again (with --begin) until nothing is held"],
        body=["set -e", *inv.setup, *part.setup, f"cd {_q(cwd)}", "exec " + " ".join(_q(a) for a in argv)]))


def prepare_sbatch(sweep: Sweep, inv: Inventory, argv: list[str], cwd: str, out_dir: str | Path) -> str:
    """The preparation job: one task on one node of the sweep's partition runs *argv* in *cwd*, after the
    inventory's and the partition's setup lines."""
    part = inv.partition(sweep.partition)
    options: dict[str, Any] = {
        "job_name": f"sbench.{sweep.campaign}.prepare", "partition": part.slurm_partition, "nodes": 1, "ntasks": 1,
        "cpus_per_task": max(2, min(PREPARE_CPUS, part.cpus_per_node)),
        "time": sweep.slurm.time or part.time_limit or PREPARE_TIME,
        **scheduling(sweep, part), **slurm_extra(sweep, part)}
    options["output"] = f"{out_dir}/{slurm_log_name('prepare', '%j')}"
    return make_sbatch(Sbatch(
        directives=options,
        comments=["sbench: prepare the campaign's datasets, models and training data on a compute node"],
        # The setup lines are the inventory's own shell commands (module load, source ...), run as written.
        body=["set -e", *inv.setup, *part.setup, f"cd {_q(cwd)}", "exec " + " ".join(_q(a) for a in argv)]))
