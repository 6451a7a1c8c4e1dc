"""The results database: the one module that owns SQL and the schema.

Everything that reads or writes ``results.duckdb`` goes through :class:`Store`.
The schema is created if missing and versioned (``metadata.schema_version``);
a database of another version is refused with a message that says what to do.
Every write runs in a transaction.

API for ``submit`` and ``status``
---------------------------------
``open_store(path, wait_s=None)``
    Open (and create) the DB for writing. DuckDB allows one writing process at a
    time; while another holds the lock we retry for ``wait_s`` seconds (default
    ``$SBENCH_DB_WAIT`` or 5 s), then raise :class:`StoreBusyError` naming the
    file and the holder's PID. Use it as a context manager; keep it open briefly.
``Store.record_manifest(events) -> list[str]``
    Idempotent upsert of manifest lines (dicts in the format of
    docs/job-directory.md): ``campaign`` -> ``campaigns``, ``point`` -> ``points``
    and ``campaign_points``, ``attempt`` -> ``runs`` (a new row starts with
    ``state='SUBMITTED'`` and ``outcome`` NULL; an existing row keeps the
    state/outcome collect found, only its submission columns are refreshed),
    ``cancel`` -> ``runs.cancel_requested_at``. Runs in one transaction.
    Returns the problems found in malformed events (``strict=True`` raises
    :class:`CollectError` on the first instead).
``Store.point_status(campaign=None, point_ids=None) -> dict[str, PointStatus]``
    Per point: attempts that are ``ok`` / ``invalid`` / ``failed`` / ``pending``
    (outcome NULL: submitted, queued, running), ``attempts``, ``last_attempt``
    and ``last_outcome``. With ``campaign``, only that campaign's attempts; with
    ``point_ids``, those points' attempts in every campaign (a point is the same
    point across campaigns); with both, the intersection.
``Store.next_attempt(campaign, point_id, repeat) -> int``
    1 + the highest attempt number recorded for that point and repeat.
``Store.status_rows(campaign=None) -> list[dict]``
    Every (campaign, point, repeat), attempts or not (invalid points have none),
    with the point's validity and reasons and its latest attempt's job id, state,
    outcome, reason and times, and the counts above. ``Store.attempt_rows``
    lists every attempt.

Tables (``SCHEMA`` below is the full list of columns)
-----------------------------------------------------
``metadata``, ``campaigns``, ``points`` (entity fields as typed columns),
``campaign_points``, ``runs`` (one per attempt), ``run_hosts``, ``stages``,
``sample_files``, ``sample_rows``, ``ranks``, ``errors``, ``trials``, ``measurements``,
``environment``, ``probes``, ``fabric``; views ``samples``, ``latest_measurements``, ``run_summary``,
``stage_durations``, ``point_status``.

Samples are stored compactly: ``sample_files`` has one row per loaded ``samples.<host>.csv``
(``file_id``, ``run_id``, ``host``, its ``path`` and ``t0``, the run's training start);
``sample_rows`` has the file's rows keyed by that small integer, ``kind`` as the ENUM
``sample_kind`` ('gpu', 'proc') and no per-row run id, host or derived column. The view
``samples`` joins them back into the documented columns (``run_id``, ``host``, ``kind``,
``device``, ``t_wall``, ``t_rel`` = ``t_wall - t0``, ``t_mono``, the metrics, ``nprocs``): query
``samples``; the two tables are storage.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import operator
import os
import re
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import duckdb
import numpy as np

try:
    import orjson
except ImportError:  # a declared dependency; the stdlib path below is the fallback
    orjson = None  # type: ignore[assignment]

from harness.contract.errors import CollectError, InputError, SchemaMismatchError, StoreBusyError
from harness.spec.catalog import BENCHMARK_PROPERTIES, DERIVED_PROPERTIES, EXPERIMENTS, STABILITY_PROPERTIES

SCHEMA_VERSION = 8  # 8: trainer (entity column) and the trainer environment's packages; 2: samples became a view over sample_files + sample_rows; 3: environment provenance;
# 4: the run_overhead view; 5: FLOPs and MFU columns in measurements; 6: references and checks, exact
# train tokens and rank-0 CPU columns, ranks.cpu_util_pct; 7: DeepSpeed ZeRO and QLoRA entity columns
DEFAULT_WAIT_S = 5.0
READ_ONLY_CONFIG = {"enable_external_access": False, "autoinstall_known_extensions": False,
                    "autoload_known_extensions": False, "allow_community_extensions": False,
                    "lock_configuration": True}

_KIND_SQL = {"int": "BIGINT", "float": "DOUBLE", "bool": "BOOLEAN", "str": "VARCHAR", "list": "VARCHAR[]"}


def _entity_columns() -> list[tuple[str, str]]:
    """Every entity-space field of every experiment, typed from the catalog's FieldSpecs."""
    cols: dict[str, str] = {}
    for exp in EXPERIMENTS.values():
        for f in exp.fields:
            sql = _KIND_SQL[f.kind]
            if cols.setdefault(f.name, sql) != sql:  # pragma: no cover - a catalog bug
                raise CollectError(f"catalog: field {f.name} has two types ({cols[f.name]} and {sql})")
    return list(cols.items())


ENTITY_COLUMNS: list[tuple[str, str]] = _entity_columns()
ENTITY_FIELDS: dict[str, str] = dict(ENTITY_COLUMNS)
# The seeds' measured properties (is_valid is its own BOOLEAN column).
PROPERTY_COLUMNS: list[str] = [p for p in BENCHMARK_PROPERTIES if p != "is_valid"] + [
    p for p in STABILITY_PROPERTIES if p != "is_valid"]

_RUN_KEY = [("run_id", "VARCHAR")]

SCHEMA: dict[str, list[tuple[str, str]]] = {
    "metadata": [("key", "VARCHAR"), ("value", "VARCHAR")],
    "campaigns": [
        ("campaign", "VARCHAR"), ("experiment", "VARCHAR"), ("sweep", "VARCHAR"), ("inventory", "VARCHAR"),
        ("partition", "VARCHAR"), ("executor", "VARCHAR"), ("created_at", "TIMESTAMP"),
        ("sbench_version", "VARCHAR"), ("source", "VARCHAR"),
        ("references_spec", "JSON"),  # the sweep's references (harness.references), newest word
    ],
    "points": [("point_id", "VARCHAR"), ("experiment", "VARCHAR"), ("valid", "BOOLEAN"),
               ("reasons", "VARCHAR[]"), ("notes", "VARCHAR[]"), *ENTITY_COLUMNS, ("entity", "JSON")],
    "campaign_points": [("campaign", "VARCHAR"), ("point_id", "VARCHAR"), ("repeat", "INTEGER")],
    "runs": [
        *_RUN_KEY, ("campaign", "VARCHAR"), ("point_id", "VARCHAR"), ("repeat", "INTEGER"),
        ("attempt", "INTEGER"), ("experiment", "VARCHAR"), ("job_dir", "VARCHAR"), ("executor", "VARCHAR"),
        ("job_id", "VARCHAR"), ("array_job_id", "VARCHAR"), ("array_task_id", "INTEGER"),
        ("submit_reason", "VARCHAR"), ("submitted_at", "TIMESTAMP"), ("cancel_requested_at", "TIMESTAMP"),
        ("state", "VARCHAR"), ("exit_code", "INTEGER"), ("exit_signal", "INTEGER"), ("elapsed_s", "DOUBLE"),
        ("node_list", "VARCHAR"), ("hosts_expected", "VARCHAR[]"), ("hosts_seen", "VARCHAR[]"),
        ("num_machines", "INTEGER"), ("max_rss_mb", "DOUBLE"),
        ("outcome", "VARCHAR"), ("reason", "VARCHAR"), ("warnings", "VARCHAR[]"),
        ("accounting_source", "VARCHAR"), ("started_at", "TIMESTAMP"), ("ended_at", "TIMESTAMP"),
        ("restarts", "INTEGER"), ("transport", "VARCHAR"), ("transport_by_host", "VARCHAR"),
        ("train_start_wall", "DOUBLE"), ("train_end_wall", "DOUBLE"), ("warmup_end_wall", "DOUBLE"),
        ("global_step", "BIGINT"), ("stopped_by", "VARCHAR"), ("sample_rows", "BIGINT"),
        ("fingerprint", "VARCHAR"), ("collected_at", "TIMESTAMP"),
    ],
    "run_hosts": [
        *_RUN_KEY, ("host", "VARCHAR"), ("machine_rank", "INTEGER"), ("expected", "BOOLEAN"),
        ("seen", "BOOLEAN"), ("has_stages", "BOOLEAN"), ("has_samples", "BOOLEAN"), ("has_result", "BOOLEAN"),
        ("has_environment", "BOOLEAN"), ("has_log", "BOOLEAN"), ("outcome", "VARCHAR"), ("exit_code", "INTEGER"),
        ("signal", "VARCHAR"), ("reason", "VARCHAR"), ("started_wall", "DOUBLE"), ("ended_wall", "DOUBLE"),
        ("transport", "VARCHAR"), ("nccl_net", "VARCHAR"),
    ],
    "stages": [
        *_RUN_KEY, ("host", "VARCHAR"), ("rank", "INTEGER"), ("stage", "VARCHAR"), ("trial", "INTEGER"),
        ("restart", "INTEGER"), ("pid", "BIGINT"), ("start_wall", "DOUBLE"), ("end_wall", "DOUBLE"),
        ("started_at", "TIMESTAMP"), ("ended_at", "TIMESTAMP"), ("duration_s", "DOUBLE"), ("status", "VARCHAR"),
        ("error", "VARCHAR"), ("info", "JSON"),
    ],
    # One row per loaded samples.<host>.csv; t0 is the run's train_start_wall (t_rel = t_wall - t0).
    "sample_files": [("file_id", "INTEGER"), *_RUN_KEY, ("host", "VARCHAR"), ("path", "VARCHAR"), ("t0", "DOUBLE")],
    # The CSV rows, keyed by file_id; queried through the ``samples`` view.
    "sample_rows": [
        ("file_id", "INTEGER"), ("kind", "sample_kind"), ("device", "INTEGER"), ("t_wall", "DOUBLE"),
        ("t_mono", "DOUBLE"), ("gpu_util", "DOUBLE"), ("mem_used_mb", "DOUBLE"), ("mem_total_mb", "DOUBLE"),
        ("power_w", "DOUBLE"), ("power_limit_w", "DOUBLE"), ("cpu_pct", "DOUBLE"), ("mem_pct", "DOUBLE"),
        ("rss_mb", "DOUBLE"), ("nprocs", "INTEGER"),
    ],
    "ranks": [
        *_RUN_KEY, ("rank", "INTEGER"), ("host", "VARCHAR"), ("local_rank", "INTEGER"), ("world_size", "INTEGER"),
        ("device", "VARCHAR"), ("global_step", "BIGINT"), ("train_start_wall", "DOUBLE"),
        ("train_end_wall", "DOUBLE"), ("warmup_end_wall", "DOUBLE"), ("stopped_by", "VARCHAR"),
        ("train_runtime", "DOUBLE"), ("train_samples_per_second", "DOUBLE"), ("train_steps_per_second", "DOUBLE"),
        ("train_tokens_per_second", "DOUBLE"), ("dataset_tokens", "BIGINT"), ("dataset_tokens_per_second", "DOUBLE"),
        ("cpu_util_pct", "DOUBLE"), ("notes", "VARCHAR[]"), ("metrics", "JSON"),
    ],
    "errors": [
        *_RUN_KEY, ("rank", "VARCHAR"), ("host", "VARCHAR"), ("kind", "VARCHAR"), ("error_type", "VARCHAR"),
        ("message", "VARCHAR"), ("traceback", "VARCHAR"), ("stage", "VARCHAR"), ("trial", "INTEGER"),
        ("t_wall", "DOUBLE"),
    ],
    "trials": [
        *_RUN_KEY, ("trial", "INTEGER"), ("host", "VARCHAR"), ("exit_code", "INTEGER"), ("outcome", "VARCHAR"),
        ("reason", "VARCHAR"), ("start_wall", "DOUBLE"), ("end_wall", "DOUBLE"), ("duration_s", "DOUBLE"),
    ],
    "measurements": [
        *_RUN_KEY, ("campaign", "VARCHAR"), ("point_id", "VARCHAR"), ("repeat", "INTEGER"), ("attempt", "INTEGER"),
        ("experiment", "VARCHAR"), ("ended_at", "TIMESTAMP"), ("is_valid", "BOOLEAN"),
        *[(p, "DOUBLE") for p in PROPERTY_COLUMNS],
        ("trials_run", "INTEGER"), ("window_start_wall", "DOUBLE"), ("window_end_wall", "DOUBLE"),
        ("window_s", "DOUBLE"), ("gpu_devices", "INTEGER"), ("gpu_samples", "BIGINT"), ("proc_samples", "BIGINT"),
        ("world_size", "INTEGER"), ("transport", "VARCHAR"), ("notes", "VARCHAR[]"),
        *[(p, "DOUBLE") for p in DERIVED_PROPERTIES],
        # memory: measured (rank 0's tensors after its last recorded optimizer step; the device peak over
        # ranks, CUDA only) beside harness.memory's prediction from spec.json
        ("memory_peak_bytes", "BIGINT"), ("activation_bytes", "BIGINT"), ("activation_error", "DOUBLE"),
        ("params_bytes", "BIGINT"), ("grads_bytes", "BIGINT"),
        ("optimizer_bytes", "BIGINT"), ("predicted_params_bytes", "BIGINT"), ("predicted_grads_bytes", "BIGINT"),
        ("predicted_optimizer_bytes", "BIGINT"), ("predicted_activation_bytes", "BIGINT"),
        ("predicted_total_bytes", "BIGINT"), ("predicted_host_bytes", "BIGINT"), ("device_bytes", "BIGINT"),
        ("predicted_oom", "BOOLEAN"),
        *ENTITY_COLUMNS,
    ],
    "environment": [
        *_RUN_KEY, ("host", "VARCHAR"), ("machine_rank", "INTEGER"), ("python", "VARCHAR"), ("torch", "VARCHAR"),
        ("transformers", "VARCHAR"), ("trl", "VARCHAR"), ("peft", "VARCHAR"), ("accelerate", "VARCHAR"),
        ("datasets", "VARCHAR"), ("submitit", "VARCHAR"), ("duckdb", "VARCHAR"), ("nvidia_ml_py", "VARCHAR"),
        ("sbench_version", "VARCHAR"), ("git_commit", "VARCHAR"), ("gpu_count", "INTEGER"),
        ("gpu_names", "VARCHAR[]"), ("gpus", "JSON"), ("cpu_count", "INTEGER"), ("memory_total_mb", "DOUBLE"),
        ("env", "JSON"), ("packages", "JSON"), ("driver_version", "VARCHAR"), ("cuda_driver", "VARCHAR"),
        ("cuda_runtime", "VARCHAR"), ("nccl", "VARCHAR"), ("cudnn", "VARCHAR"), ("flash_attn", "VARCHAR"),
        ("hca_firmware", "JSON"),
        ("trainer", "VARCHAR"), ("trainer_packages", "JSON"),  # the training processes' packages (fms-hf-tuning)
    ],
    # harness.runner.memsnap: each rank's memory at fixed phases of recorded steps.
    "memory": [
        *_RUN_KEY, ("rank", "INTEGER"), ("host", "VARCHAR"), ("step", "BIGINT"), ("phase", "VARCHAR"),
        ("t_wall", "DOUBLE"), ("params_bytes", "BIGINT"), ("trainable_bytes", "BIGINT"), ("grads_bytes", "BIGINT"),
        ("optimizer_bytes", "BIGINT"), ("cuda_allocated_bytes", "BIGINT"), ("cuda_peak_bytes", "BIGINT"),
        ("cuda_reserved_bytes", "BIGINT"), ("rss_bytes", "BIGINT"),
    ],
    # Collect's check of each point-repeat (latest attempt) against the campaign's references.
    "checks": [
        ("campaign", "VARCHAR"), ("point_id", "VARCHAR"), ("repeat", "INTEGER"), ("run_id", "VARCHAR"),
        ("metric", "VARCHAR"), ("value", "DOUBLE"), ("reference", "DOUBLE"), ("lower_bound", "DOUBLE"),
        ("upper_bound", "DOUBLE"), ("deviation", "DOUBLE"), ("unit", "VARCHAR"), ("selector", "JSON"),
        ("status", "VARCHAR"), ("reason", "VARCHAR"), ("checked_at", "TIMESTAMP"),
    ],
    # sbench probe: one row per probed host.
    "probes": [
        ("probe_id", "VARCHAR"), ("host", "VARCHAR"), ("cluster", "VARCHAR"), ("partition", "VARCHAR"),
        ("probed_at", "TIMESTAMP"), ("gpu_count", "INTEGER"), ("gpu_names", "VARCHAR[]"),
        ("driver_version", "VARCHAR"), ("cuda_driver", "VARCHAR"), ("cores", "INTEGER"), ("memory_gb", "DOUBLE"),
        ("memlock", "VARCHAR"), ("hcas", "JSON"), ("differences", "VARCHAR[]"), ("doc", "JSON"),
    ],
    # sbench fabric: one row per (fabric run, collective, message size).
    "fabric": [
        ("fabric_id", "VARCHAR"), ("cluster", "VARCHAR"), ("partition", "VARCHAR"), ("nodes", "INTEGER"),
        ("world_size", "INTEGER"), ("backend", "VARCHAR"), ("enable_roce", "BOOLEAN"), ("op", "VARCHAR"),
        ("bytes", "BIGINT"), ("iters", "INTEGER"), ("time_us", "DOUBLE"), ("algbw_gbps", "DOUBLE"),
        ("busbw_gbps", "DOUBLE"), ("transport_by_host", "JSON"), ("ok", "BOOLEAN"), ("reason", "VARCHAR"),
        ("job_dir", "VARCHAR"), ("measured_at", "TIMESTAMP"),
    ],
}
PRIMARY_KEYS = {"metadata": ("key",), "probes": ("probe_id", "host"), "campaigns": ("campaign",), "points": ("point_id",),
                "campaign_points": ("campaign", "point_id", "repeat"), "runs": ("run_id",),
                "measurements": ("run_id",), "sample_files": ("file_id",)}
_COLUMN_NAMES = {t: frozenset(c for c, _ in cols) for t, cols in SCHEMA.items()}
# Tables whose rows belong to one run and are replaced as a whole when the run changes
# (``sample_rows`` go with their ``sample_files`` row).
RUN_CHILD_TABLES = ("run_hosts", "stages", "sample_files", "ranks", "errors", "trials", "measurements",
                    "environment", "memory")
# Types created before the tables.
TYPES = {"sample_kind": "ENUM ('gpu', 'proc')"}
# Columns of ``runs`` that a manifest ``attempt`` line owns; collect owns the rest.
MANIFEST_RUN_COLUMNS = ("campaign", "point_id", "repeat", "attempt", "experiment", "job_dir", "executor", "job_id",
                        "array_job_id", "array_task_id", "submit_reason", "submitted_at")

_HEADLINE = ["train_runtime", "train_tokens_per_second", "dataset_tokens_per_second",
             "gpu_compute_utilization_avg", "gpu_memory_utilization_peak", "f_gpu_oom", "f_no_error"]
VIEWS: dict[str, str] = {
    # The samples as documented (docs/job-directory.md), one row per CSV row.
    "samples": """
        SELECT f.run_id, f.host, s.kind, s.device, s.t_wall, s.t_wall - f.t0 AS t_rel, s.t_mono, s.gpu_util,
               s.mem_used_mb, s.mem_total_mb, s.power_w, s.power_limit_w, s.cpu_pct, s.mem_pct, s.rss_mb, s.nprocs
        FROM sample_rows s JOIN sample_files f USING (file_id)""",
    # The latest valid measurement of each point (across campaigns): what --force/skip decisions and
    # most analyses want.
    "latest_measurements": """
        SELECT * EXCLUDE (_rn) FROM (
            SELECT m.*, row_number() OVER (PARTITION BY m.point_id
                                           ORDER BY m.ended_at DESC NULLS LAST, m.run_id DESC) AS _rn
            FROM measurements m WHERE m.is_valid)
        WHERE _rn = 1""",
    "run_summary": f"""
        SELECT r.run_id, r.campaign, r.point_id, r.repeat, r.attempt, r.experiment, p.model_name,
               p.number_gpus, p.number_nodes, p.batch_size, p.model_max_length, p.distributed_backend,
               p.enable_roce, r.executor, r.job_id, r.state, r.outcome, r.reason, r.elapsed_s, r.node_list,
               r.transport, r.accounting_source, r.submitted_at, r.started_at, r.ended_at, m.is_valid,
               {", ".join("m." + c for c in _HEADLINE)}
        FROM runs r LEFT JOIN points p USING (point_id) LEFT JOIN measurements m USING (run_id)""",
    "stage_durations": """
        SELECT run_id, stage, trial, count(*) AS n, count(DISTINCT host) AS hosts,
               min(duration_s) AS min_s, avg(duration_s) AS avg_s, max(duration_s) AS max_s,
               count(*) FILTER (WHERE status = 'error') AS errors,
               count(*) FILTER (WHERE status = 'incomplete') AS incomplete
        FROM stages GROUP BY run_id, stage, trial""",
    # Per run and host, from the stage events: the seconds from the host's first event (the node runner
    # starting) to the first train stage, the host's span, the train stages' span (per trial, summed), and
    # what is left outside training. prepared_in_job: the job had to generate or tokenize its data.
    "run_overhead": """
        WITH s AS (SELECT run_id, host, stage, trial, start_wall, end_wall, info FROM stages
                   WHERE start_wall IS NOT NULL),
        h AS (SELECT run_id, host, min(start_wall) AS job_start_wall,
                     max(coalesce(end_wall, start_wall)) AS job_end_wall,
                     bool_or(json_extract_string(info, '$.prepared.status') IN ('built', 'rebuilt')
                             OR json_extract_string(info, '$.status_before') IN ('missing', 'stale'))
                         AS prepared_in_job
              FROM s GROUP BY run_id, host),
        t AS (SELECT run_id, host, trial, min(start_wall) AS t0, max(end_wall) AS t1 FROM s
              WHERE stage = 'train' GROUP BY run_id, host, trial),
        tt AS (SELECT run_id, host, min(t0) AS first_train_wall, sum(t1 - t0) AS train_s FROM t
               GROUP BY run_id, host)
        SELECT h.run_id, h.host, h.job_start_wall, tt.first_train_wall,
               tt.first_train_wall - h.job_start_wall AS startup_s,
               h.job_end_wall - h.job_start_wall AS allocation_s, tt.train_s,
               (h.job_end_wall - h.job_start_wall) - coalesce(tt.train_s, 0) AS outside_train_s,
               CASE WHEN h.job_end_wall > h.job_start_wall
                    THEN ((h.job_end_wall - h.job_start_wall) - coalesce(tt.train_s, 0))
                         / (h.job_end_wall - h.job_start_wall) END AS outside_train_fraction,
               coalesce(h.prepared_in_job, false) AS prepared_in_job
        FROM h LEFT JOIN tt USING (run_id, host)""",
    "point_status": """
        SELECT cp.campaign, cp.point_id, cp.repeat, p.valid,
               count(r.run_id) AS attempts,
               count(*) FILTER (WHERE r.outcome = 'ok') AS ok,
               count(*) FILTER (WHERE r.outcome = 'invalid') AS invalid,
               count(*) FILTER (WHERE r.outcome = 'failed') AS failed,
               count(*) FILTER (WHERE r.run_id IS NOT NULL AND r.outcome IS NULL) AS pending
        FROM campaign_points cp LEFT JOIN points p USING (point_id)
             LEFT JOIN runs r ON r.campaign = cp.campaign AND r.point_id = cp.point_id AND r.repeat = cp.repeat
        GROUP BY ALL""",
}



_INT_RANGE = {"INTEGER": 2**31, "BIGINT": 2**63}


def _to_int(v: Any, bits: str = "BIGINT") -> int | None:
    """An integer that fits the column (INTEGER or BIGINT); None for anything else, so one out-of-range
    value in a file can never abort a collect."""
    if isinstance(v, bool):
        return int(v)
    if not isinstance(v, int):
        try:
            f = float(v)
        except (TypeError, ValueError, OverflowError):
            return None
        if not f.is_integer():  # also NaN and infinity
            return None
        v = int(f)
    limit = _INT_RANGE[bits]
    return v if -limit <= v < limit else None


def _to_float(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    try:
        return float(v)
    except (TypeError, ValueError, OverflowError):
        return None


def _to_str(v: Any) -> str:
    """Text DuckDB accepts: no NUL, valid UTF-8 (lone surrogates from a JSON file become U+FFFD)."""
    text = v if isinstance(v, str) else str(v)
    if text.isascii() and "\0" not in text:
        return text  # the common case, checked at C speed
    if "\0" in text:
        text = text.replace("\0", "\\0")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text


def _finite(value: Any) -> Any:
    """*value* with every non-finite float replaced by None (JSON has no NaN or infinity)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _to_bool(v: Any) -> bool | None:
    if isinstance(v, str):
        return {"true": True, "false": False}.get(v.lower())
    return bool(v) if isinstance(v, (bool, int)) else None


def _to_list(v: Any) -> list[str] | None:
    return [_to_str(x) for x in v] if isinstance(v, (list, tuple)) else None


def _to_ts(v: Any) -> _dt.datetime | None:
    return v if isinstance(v, _dt.datetime) else utc(v)


# Python values -> the column's type; anything that does not fit (a runner file with a string where a
# number belongs) becomes NULL rather than aborting the whole collect.
_COERCE = {"VARCHAR": _to_str,
           "JSON": lambda v: v if isinstance(v, JsonText) else _json_text(v) if isinstance(v, str) else to_json(v),
           "BIGINT": _to_int, "INTEGER": lambda v: _to_int(v, "INTEGER"),
           "DOUBLE": _to_float, "BOOLEAN": _to_bool, "VARCHAR[]": _to_list, "TIMESTAMP": _to_ts}


def _json_text(text: str) -> str | None:
    """A JSON column's text as DuckDB will parse it: re-encoded when Python's parser had to accept
    NaN/Infinity, None when it is no JSON at all."""
    try:
        return to_json(json.loads(text))
    except (ValueError, RecursionError):
        return None


def _epochs(values: Sequence[Any]) -> np.ndarray | None:
    """Epoch seconds (every value a float or None) as datetime64[us] (None: NaT), rounded as :func:`utc`
    rounds them (to the nearest microsecond, half to even) but in one vector operation; None when a value
    is anything else or outside 1970-5138."""
    if not set(map(type, values)) <= {float, type(None)}:
        return None
    x = np.array([np.nan if v is None else v for v in values] if None in values else values, dtype=np.float64)
    missing = np.isnan(x)
    x[missing] = 0.0
    if not bool(np.all((x >= 0.0) & (x < 1e11))):
        return None
    whole = np.floor(x)
    micros = whole.astype(np.int64) * 1_000_000 + np.rint((x - whole) * 1e6).astype(np.int64)
    out = micros.astype("datetime64[us]")
    out[missing] = np.datetime64("NaT")
    return out


def _column(values: Sequence[Any], sql_type: str) -> np.ndarray:
    if sql_type == "TIMESTAMP" and values and (epochs := _epochs(values)) is not None:
        return epochs
    conv = _COERCE[sql_type]
    arr = np.empty(len(values), dtype=object)
    same = _AS_IS.get(sql_type)
    if same is not None:
        arr[:] = [v if v.__class__ is same else None if v is None else conv(v) for v in values]
    elif sql_type == "VARCHAR":  # the common case inlined: plain ASCII text without NUL is stored as is
        arr[:] = [v if v.__class__ is str and v.isascii() and "\0" not in v else None if v is None else conv(v)
                  for v in values]
    elif sql_type in _INT_RANGE:  # an int in the column's range is stored as is
        lo, hi = -_INT_RANGE[sql_type], _INT_RANGE[sql_type]
        arr[:] = [v if v.__class__ is int and lo <= v < hi else None if v is None else conv(v) for v in values]
    else:
        arr[:] = [None if v is None else conv(v) for v in values]
    return arr


def _transpose(names: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> tuple[list[Sequence[Any]], bool]:
    """The values of each of *names* in *rows* (a missing key is None), and whether every row has exactly
    these keys (then the transposition ran at C speed: itemgetter found them all and the counts add up)."""
    if not rows:
        return [[] for _ in names], True
    try:
        values = list(zip(*map(operator.itemgetter(*names), rows))) if len(names) > 1 else \
            [[r[names[0]] for r in rows]]
        return values, sum(map(len, rows)) == len(rows) * len(names)
    except KeyError:
        return [[r.get(c) for r in rows] for c in names], False


def frame(columns: Sequence[tuple[str, str]], rows: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
    """Rows as a dict of typed object arrays, which DuckDB scans directly (no pandas, no row loop)."""
    values, _ = _transpose([c for c, _ in columns], rows)
    return {c: _column(v, t) for (c, t), v in zip(columns, values)}


@dataclass
class Staged:
    """Rows of one table as typed columns (an Arrow table, else :func:`frame`'s arrays), ready for
    :meth:`Store.insert`."""

    table: str
    rows: int
    columns: Any


# Arrow types of the column types (an Arrow table is scanned by DuckDB in parallel, without the GIL).
_ARROW_TYPES = {"VARCHAR": "string", "JSON": "string", "BIGINT": "int64", "INTEGER": "int32", "DOUBLE": "float64",
                "BOOLEAN": "bool_", "TIMESTAMP": "timestamp", "VARCHAR[]": "list_"}


def check_keys(table: str, rows: Sequence[Mapping[str, Any]]) -> None:
    """Refuse a row with a key that is no column of *table*: a misspelled key would otherwise be a NULL
    nobody notices. A programming error, so it is loud (ValueError), not a warning."""
    known = _COLUMN_NAMES[table]
    shapes: set[tuple[str, ...]] = set()
    for r in rows:
        shape = tuple(r)
        if shape in shapes:
            continue
        shapes.add(shape)
        unknown = [k for k in shape if k not in known]
        if unknown:
            raise ValueError(f"{table}: row with unknown column(s) {', '.join(map(repr, unknown))}")


def stage(table: str, rows: Sequence[Mapping[str, Any]]) -> Staged:
    """Convert *rows* for :meth:`Store.insert` into *table*; pure Python, no database (so it can be done
    while the connection is busy elsewhere). A key that is no column of *table* raises ValueError."""
    if not rows:
        return Staged(table, 0, {})
    return Staged(table, len(rows), typed(SCHEMA[table], rows, table))


def typed(columns: Sequence[tuple[str, str]], rows: Sequence[Mapping[str, Any]], table: str | None = None) -> Any:
    """*rows* (holding these *columns*; missing keys are NULL) as typed columns DuckDB can scan: an Arrow
    table, else :func:`frame`'s arrays. With *table*, a key that is no column of it raises ValueError."""
    values, exact = _transpose([c for c, _ in columns], rows)
    if not exact and table is not None:
        check_keys(table, rows)
    fast = _arrow_table(columns, values) if rows else None
    return fast if fast is not None else {c: _column(v, t) for (c, t), v in zip(columns, values)}


_probed = False


class _PandasOutOfSight:
    """An import finder that says pandas is not installed (see :func:`arrow`)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def arrow() -> ModuleType:
    """pyarrow (imported here, not at import: most commands never write), with its pandas probe settled.

    pyarrow's first conversion of a Python sequence imports pandas only to ask whether the sequence is a
    pandas object: 0.18 s of CPU holding the interpreter lock, in the middle of a collect, for a library
    sbench never hands it. So, unless pandas is imported already, that probe runs here once with pandas
    out of sight and the answer is no. pyarrow still imports pandas for real when asked for pandas
    output (``to_pandas``)."""
    global _probed
    import pyarrow as pa

    if not _probed:
        _probed = True
        if "pandas" not in sys.modules:
            hide = _PandasOutOfSight()
            sys.meta_path.insert(0, hide)
            try:
                pa.array([], pa.int8())
            finally:
                sys.meta_path.remove(hide)
    return pa


def _arrow_table(columns: Sequence[tuple[str, str]], values: Sequence[Sequence[Any]]) -> Any:
    """Columns whose values already are what :func:`_column` would make of them (one Python type, or None,
    that fits the column) as an Arrow table, converted by Arrow at C speed; a column that needs
    :func:`_column`'s conversions goes through it. None when a column has no plain Arrow type or Arrow
    refuses a value (the caller then keeps numpy arrays, which DuckDB converts while scanning)."""
    if any(t not in _ARROW_TYPES for _, t in columns):
        return None
    pa = arrow()

    out = {}
    for (c, t), v in zip(columns, values):
        kinds = set(map(type, v))
        kinds.discard(type(None))
        try:
            arr = None
            if t == "VARCHAR" and kinds <= {str}:
                # Valid UTF-8 (Arrow refuses a lone surrogate) with no NUL is stored as it is.
                arr = None if "\0" in "".join(filter(None, v)) else pa.array(v, pa.string())
            elif t == "JSON" and kinds <= {JsonText}:
                arr = pa.array(v, pa.string())
            elif t in _INT_RANGE and kinds <= {int}:  # Arrow refuses an int out of the column's range
                arr = pa.array(v, pa.int32() if t == "INTEGER" else pa.int64())
            elif t == "DOUBLE" and kinds <= {float}:
                arr = pa.array(v, pa.float64())
            elif t == "BOOLEAN" and kinds <= {bool}:
                arr = pa.array(v, pa.bool_())
            elif t == "TIMESTAMP" and v and (epochs := _epochs(v)) is not None:
                arr = pa.array(epochs, pa.timestamp("us"), from_pandas=True)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            arr = None
        if arr is None:
            col = _column(v, t)
            typ = pa.timestamp("us") if t == "TIMESTAMP" else pa.list_(pa.string()) if t == "VARCHAR[]" else \
                getattr(pa, _ARROW_TYPES[t])()
            try:
                # from_pandas only where it means NaT -> NULL (a datetime64 column); a NaN stays a NaN elsewhere
                arr = pa.array(col, typ, from_pandas=col.dtype.kind == "M")
            except (pa.ArrowException, TypeError, ValueError, OverflowError):
                return None
        out[c] = arr
    return pa.table(out)

# The samples CSV format (docs/job-directory.md): column order and types.
SAMPLE_CSV_COLUMNS = (("t_wall", "DOUBLE"), ("t_mono", "DOUBLE"), ("kind", "VARCHAR"), ("device", "INTEGER"),
                      ("gpu_util", "DOUBLE"), ("mem_used_mb", "DOUBLE"), ("mem_total_mb", "DOUBLE"),
                      ("power_w", "DOUBLE"), ("power_limit_w", "DOUBLE"), ("cpu_pct", "DOUBLE"),
                      ("mem_pct", "DOUBLE"), ("rss_mb", "DOUBLE"), ("nprocs", "INTEGER"))
# What collect's reader asks for: the same, with ``kind`` read straight into the ENUM (a kind other than
# gpu/proc is a rejected line with its reason, like any value that does not convert).
_SAMPLE_READ_TYPES = {**dict(SAMPLE_CSV_COLUMNS), "kind": "sample_kind"}
# Reader errors about one value; any other kind is about the whole line (see _reject_reasons).
_CSV_VALUE_ERRORS = ("CAST",)


def q(name: str) -> str:
    """A quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


_EPOCH = _dt.datetime(1970, 1, 1)


def utc(value: Any) -> _dt.datetime | None:
    """An epoch number or ISO-8601 string as a naive UTC datetime (the DB stores TIMESTAMP in UTC)."""
    if value is None or value == "":
        return None
    try:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return _EPOCH + _dt.timedelta(seconds=float(value))  # = fromtimestamp(utc), 2.5x faster
        if isinstance(value, _dt.datetime):
            d = value
        else:
            d = _dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        if d.tzinfo is not None:
            d = d.astimezone(_dt.timezone.utc).replace(tzinfo=None)
        return d
    except (ValueError, OverflowError, OSError):
        return None


def coerce_entity_value(kind_sql: str, value: Any) -> Any:
    """An entity value in its column's type (None when it cannot be one)."""
    if value is None:
        return None
    try:
        if kind_sql == "BIGINT":
            return None if isinstance(value, bool) else _to_int(value)
        if kind_sql == "DOUBLE":
            return None if isinstance(value, bool) else _to_float(value)
        if kind_sql == "BOOLEAN":
            if isinstance(value, str):
                return {"true": True, "false": False}.get(value.lower())
            return bool(value)
        if kind_sql == "VARCHAR[]":
            if isinstance(value, str):
                return [_to_str(v) for v in value.split()]
            return [_to_str(v) for v in value]
        return _to_str(value)
    except (TypeError, ValueError):
        return None


def entity_values(entity: Mapping[str, Any] | None) -> dict[str, Any]:
    entity = entity or {}
    return {name: coerce_entity_value(sql, entity.get(name)) for name, sql in ENTITY_COLUMNS}


class JsonText(str):
    """Text :func:`to_json` made: already what a JSON column accepts (not parsed again when stored)."""

    __slots__ = ()


# Values already of the column's Python type need no conversion (checked by exact class: bool is an int).
_AS_IS = {"DOUBLE": float, "TIMESTAMP": _dt.datetime, "BOOLEAN": bool, "JSON": JsonText}


_ORJSON_OPTS = (orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS | orjson.OPT_PASSTHROUGH_DATETIME
                | orjson.OPT_PASSTHROUGH_DATACLASS) if orjson else 0


def to_json(value: Any) -> str | None:
    """JSON text DuckDB's JSON type accepts: non-finite floats become null, keys strings, text valid."""
    if value is None:
        return None
    if orjson is not None:
        try:  # the common case (NaN/infinity become null, as below); lone surrogates or huge ints fall through
            return JsonText(orjson.dumps(value, default=str, option=_ORJSON_OPTS).decode())
        except (TypeError, orjson.JSONEncodeError):
            pass
    try:
        return JsonText(_to_str(json.dumps(value, sort_keys=True, default=str, allow_nan=False)))
    except ValueError:
        return JsonText(_to_str(json.dumps(_finite(value), sort_keys=True, default=str, allow_nan=False)))
    except (TypeError, RecursionError):
        return None


@dataclass
class PointStatus:
    """Attempt counts of one point, for submit's skip / --force / --retry-failed decisions."""

    point_id: str
    ok: int = 0
    invalid: int = 0
    failed: int = 0
    pending: int = 0
    attempts: int = 0
    last_attempt: int = 0
    last_outcome: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _default_wait() -> float:
    try:
        return float(os.environ.get("SBENCH_DB_WAIT", DEFAULT_WAIT_S))
    except ValueError:
        return DEFAULT_WAIT_S


def _is_lock_error(exc: Exception) -> bool:
    text = str(exc)
    return "lock" in text.lower() and ("Could not set lock" in text or "Conflicting lock" in text)


def open_store(path: str | Path, *, read_only: bool = False, wait_s: float | None = None) -> Store:
    """Open the results DB (creating it and its schema unless *read_only*); see :class:`Store`."""
    return Store.open(path, read_only=read_only, wait_s=wait_s)


class Store:
    """A connection to the results DB with the schema checked. Not thread-safe."""

    def __init__(self, con: duckdb.DuckDBPyConnection, path: Path, read_only: bool) -> None:
        self.con = con
        self.path = path
        self.read_only = read_only
        self._tx_depth = 0

    # -- opening -------------------------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | Path, *, read_only: bool = False, wait_s: float | None = None) -> Store:
        p = Path(path)
        if read_only and not p.exists():
            raise InputError(f"{p}: no results database here; run `sbench collect` first (or pass --db)")
        if not read_only:
            try:
                p.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise CollectError(f"cannot create {p.parent}: {exc}") from None
        wait = _default_wait() if wait_s is None else wait_s
        deadline = time.monotonic() + max(0.0, wait)
        # A read-only connection is sandboxed: no ATTACH (of a writable link to this very file), no COPY
        # TO, no reading other files, no extensions, and no SET to undo that.
        config = READ_ONLY_CONFIG if read_only else {}
        while True:
            try:
                con = duckdb.connect(str(p), read_only=read_only, config=dict(config))
                break
            except duckdb.Error as exc:
                if not _is_lock_error(exc):
                    raise CollectError(f"{p}: cannot open the results database: {exc}") from None
                if time.monotonic() >= deadline:
                    m = re.search(r"\(PID (\d+)\)", str(exc))
                    holder = f" (PID {m.group(1)})" if m else ""
                    raise StoreBusyError(
                        f"{p} is in use by another process{holder}; waited {wait:g} s. DuckDB allows one "
                        f"writer at a time: wait for that sbench collect/submit to finish and retry "
                        f"(SBENCH_DB_WAIT=<seconds> waits longer).") from None
                time.sleep(0.2)
        store = cls(con, p, read_only)
        try:
            store._check_schema()
        except BaseException:
            con.close()
            raise
        return store

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _tables(self) -> set[str]:
        rows = self.con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main'").fetchall()
        return {r[0] for r in rows}

    def _check_schema(self) -> None:
        tables = self._tables()
        if "metadata" in tables:
            try:
                rows = self.con.execute("SELECT value FROM metadata WHERE key = 'schema_version'").fetchall()
            except duckdb.Error:
                rows = []
            found = rows[0][0] if rows else None
            if found != str(SCHEMA_VERSION):
                raise SchemaMismatchError(
                    f"{self.path} has results schema version {found or '(none)'}, but this sbench uses version "
                    f"{SCHEMA_VERSION}. Move the file aside (e.g. mv {self.path} {self.path}.v{found or 'old'}) "
                    f"and run `sbench collect` to rebuild it from the job directories, or use the sbench "
                    f"version that wrote it.")
            problems = self._schema_problems()
            if problems:
                raise SchemaMismatchError(
                    f"{self.path} says schema version {SCHEMA_VERSION} but its tables were changed "
                    f"({'; '.join(problems[:5])}{'; ...' if len(problems) > 5 else ''}). Move the file aside "
                    f"(mv {self.path} {self.path}.damaged) and run `sbench collect` to rebuild it from the job "
                    "directories.")
            return
        if tables:
            raise SchemaMismatchError(
                f"{self.path} is not an sbench results database (it has tables {', '.join(sorted(tables))} but "
                f"no metadata table with a schema_version); pass another --db or move it aside.")
        if self.read_only:
            raise SchemaMismatchError(f"{self.path} is empty: no sbench schema; run `sbench collect` first")
        with self.transaction():
            for name, definition in TYPES.items():
                self.con.execute(f"CREATE TYPE {q(name)} AS {definition}")
            for table, cols in SCHEMA.items():
                body = ", ".join(f"{q(c)} {t}" for c, t in cols)
                pk = PRIMARY_KEYS.get(table)
                if pk:
                    body += f", PRIMARY KEY ({', '.join(q(c) for c in pk)})"
                self.con.execute(f"CREATE TABLE IF NOT EXISTS {q(table)} ({body})")
            for name, sql in VIEWS.items():
                self.con.execute(f"CREATE OR REPLACE VIEW {q(name)} AS {sql}")
            self.con.execute("INSERT INTO metadata VALUES ('schema_version', ?), ('created_by', 'sbench')",
                             [str(SCHEMA_VERSION)])

    def _schema_problems(self) -> list[str]:
        """What differs from :data:`SCHEMA` and :data:`VIEWS`: missing tables, views or columns, or a
        column of another type (one query over the catalog)."""
        have: dict[str, list[tuple[str, str]]] = {}
        for table, col, dtype in self.con.execute(
                "SELECT table_name, column_name, data_type FROM information_schema.columns "
                "WHERE table_schema = 'main' ORDER BY table_name, ordinal_position").fetchall():
            have.setdefault(table, []).append((col, dtype))
        kinds = dict(self.con.execute("SELECT table_name, table_type FROM information_schema.tables "
                                      "WHERE table_schema = 'main'").fetchall())
        problems = []
        for table, cols in SCHEMA.items():
            if kinds.get(table) != "BASE TABLE":
                problems.append(f"table {table} is missing")
                continue
            found = dict(have.get(table, []))
            for col, dtype in cols:
                if col not in found:
                    problems.append(f"{table}.{col} is missing")
                elif dtype in _KIND_SQL.values() or dtype in _COERCE:
                    if found[col] != dtype and not (dtype == "JSON" and found[col] == "JSON"):
                        problems.append(f"{table}.{col} is {found[col]}, not {dtype}")
        for view in VIEWS:
            if kinds.get(view) != "VIEW":
                problems.append(f"view {view} is missing")
        return problems

    # -- transactions --------------------------------------------------------------------------------------
    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One transaction; nested uses join the outer one."""
        if self._tx_depth:
            self._tx_depth += 1
            try:
                yield
            finally:
                self._tx_depth -= 1
            return
        self.con.execute("BEGIN TRANSACTION")
        self._tx_depth = 1
        try:
            yield
        except BaseException:
            self._tx_depth = 0
            try:
                self.con.execute("ROLLBACK")
            except duckdb.Error:
                pass
            raise
        self._tx_depth = 0
        self.con.execute("COMMIT")

    # -- generic helpers -----------------------------------------------------------------------------------
    def insert(self, table: str, rows: Sequence[Mapping[str, Any]] | Staged) -> int:
        """Insert *rows* (dicts, or :func:`stage`'s typed columns, built ahead without the database)."""
        staged = rows if isinstance(rows, Staged) else stage(table, rows)
        if not staged.rows:
            return 0
        self.con.register("_sbench_stage", staged.columns)
        try:
            cols = ", ".join(f"CAST({q(c)} AS {t}) AS {q(c)}" for c, t in SCHEMA[table])
            self.con.execute(f"INSERT INTO {q(table)} BY NAME SELECT {cols} FROM _sbench_stage")
        finally:
            self.con.unregister("_sbench_stage")
        return staged.rows

    def delete_runs(self, run_ids: Sequence[str], tables: Iterable[str] = RUN_CHILD_TABLES) -> None:
        if not run_ids:
            return
        self.con.register("_sbench_ids", frame([("run_id", "VARCHAR")], [{"run_id": r} for r in run_ids]))
        try:
            for t in tables:
                if t == "sample_files":
                    self.con.execute("DELETE FROM sample_rows WHERE file_id IN (SELECT file_id FROM sample_files "
                                     "WHERE run_id IN (SELECT run_id FROM _sbench_ids))")
                self.con.execute(f"DELETE FROM {q(t)} WHERE run_id IN (SELECT run_id FROM _sbench_ids)")
        finally:
            self.con.unregister("_sbench_ids")

    def _upsert(self, table: str, rows: Sequence[Mapping[str, Any]], columns: Sequence[str],
                keep_when_null: bool = False) -> None:
        """Insert rows whose key is new; update *columns* of existing rows only where a value differs
        (so re-recording the same rows rewrites nothing). With *keep_when_null* a NULL in *rows* leaves
        the stored value alone."""
        if not rows:
            return
        check_keys(table, rows)
        key = PRIMARY_KEYS[table]
        types = dict(SCHEMA[table])
        cols = list(dict.fromkeys([*key, *columns]))
        # Later duplicates of a key win (a manifest is append-only: the last line is the newest word).
        latest: dict[tuple[Any, ...], Mapping[str, Any]] = {}
        for r in rows:
            latest[tuple(r.get(k) for k in key)] = r
        self.con.register("_sbench_up", typed([(c, types[c]) for c in cols], list(latest.values())))
        try:
            self.con.execute("CREATE OR REPLACE TEMP TABLE _sbench_up_t AS SELECT "
                             + ", ".join(f"CAST({q(c)} AS {types[c]}) AS {q(c)}" for c in cols) + " FROM _sbench_up")
            on = " AND ".join(f"t.{q(k)} = s.{q(k)}" for k in key)
            upd = [c for c in columns if c not in key]
            if upd:
                if keep_when_null:
                    sets = ", ".join(f"{q(c)} = coalesce(s.{q(c)}, t.{q(c)})" for c in upd)
                    differs = " OR ".join(f"(s.{q(c)} IS NOT NULL AND t.{q(c)} IS DISTINCT FROM s.{q(c)})"
                                          for c in upd)
                else:
                    sets = ", ".join(f"{q(c)} = s.{q(c)}" for c in upd)
                    differs = " OR ".join(f"t.{q(c)} IS DISTINCT FROM s.{q(c)}" for c in upd)
                self.con.execute(f"UPDATE {q(table)} AS t SET {sets} FROM _sbench_up_t AS s WHERE {on} AND ({differs})")
            self.con.execute(
                f"INSERT INTO {q(table)} ({', '.join(q(c) for c in cols)}) "
                f"SELECT {', '.join('s.' + q(c) for c in cols)} FROM _sbench_up_t AS s "
                f"WHERE NOT EXISTS (SELECT 1 FROM {q(table)} AS t WHERE {on})")
        finally:
            self.con.unregister("_sbench_up")
            self.con.execute("DROP TABLE IF EXISTS _sbench_up_t")

    def fetch_dicts(self, sql: str, params: Sequence[Any] | None = None) -> list[dict[str, Any]]:
        cur = self.con.execute(sql, params or [])
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row)) for row in cur.fetchall()]

    # -- manifest (submit's API) ---------------------------------------------------------------------------
    def record_manifest(self, events: Iterable[Mapping[str, Any]], *, strict: bool = True,
                        source: str = "manifest") -> list[str]:
        """Idempotently record manifest events (see the module docstring)."""
        campaigns: list[dict[str, Any]] = []
        points: list[dict[str, Any]] = []
        links: list[dict[str, Any]] = []
        attempts: list[dict[str, Any]] = []
        cancels: list[tuple[str, list[str], Any]] = []
        references: dict[str, list[Any]] = {}  # campaign -> the newest references line's
        problems: list[str] = []

        def bad(i: int, msg: str) -> None:
            text = f"{source} event {i}: {msg}"
            if strict:
                raise CollectError(text)
            problems.append(text)

        for i, ev in enumerate(events, 1):
            if not isinstance(ev, Mapping):
                bad(i, "not a JSON object")
                continue
            kind = ev.get("type")
            try:
                if kind == "campaign":
                    campaigns.append({"campaign": str(ev["campaign"]), "experiment": ev.get("experiment"),
                                      "sweep": ev.get("sweep"), "inventory": ev.get("inventory"),
                                      "partition": ev.get("partition"), "executor": ev.get("executor"),
                                      "created_at": utc(ev.get("created_at")),
                                      "sbench_version": ev.get("sbench_version"), "source": "manifest",
                                      "references_spec": to_json(ev.get("references") or [])})
                    references[str(ev["campaign"])] = ev.get("references") or []
                elif kind == "references":
                    if not isinstance(ev.get("references"), list):
                        raise TypeError("references must be a list")
                    references[str(ev["campaign"])] = ev["references"]
                elif kind == "point":
                    points.append(point_row(str(ev["point_id"]), ev.get("experiment"), ev.get("entity"),
                                            ev.get("valid"), ev.get("reasons"), ev.get("notes")))
                    links.append({"campaign": str(ev["campaign"]), "point_id": str(ev["point_id"]),
                                  "repeat": key_int(ev.get("repeat") or 0, "repeat")})
                elif kind == "attempt":
                    attempts.append(attempt_row(ev))
                    links.append({"campaign": str(ev["campaign"]), "point_id": str(ev["point_id"]),
                                  "repeat": key_int(ev.get("repeat") or 0, "repeat")})
                elif kind == "cancel":
                    # SLURM attempts are named by job id, local ones (no job id when queued) by job dir.
                    ids, dirs = ev.get("job_ids") or [], ev.get("job_dirs") or []
                    if not isinstance(ids, list) or not isinstance(dirs, list):
                        raise TypeError("job_ids and job_dirs must be lists")
                    cancels.append((str(ev["campaign"]), [str(j) for j in ids + dirs], utc(ev.get("at"))))
                else:
                    bad(i, f"unknown type {kind!r} (expected campaign, point, attempt, cancel or references)")
            except (KeyError, TypeError, ValueError) as exc:
                bad(i, f"{kind} line is malformed: {exc!r}")
        with self.transaction():
            self._upsert("campaigns", campaigns, [c for c, _ in SCHEMA["campaigns"]])
            for camp, refs in references.items():
                self.con.execute("UPDATE campaigns SET references_spec = ?::JSON WHERE campaign = ? AND "
                                 "references_spec IS DISTINCT FROM ?::JSON", [to_json(refs), camp, to_json(refs)])
            self._upsert("points", points, [c for c, _ in SCHEMA["points"]])
            self._upsert("campaign_points", links, [])
            self._upsert("runs", attempts, MANIFEST_RUN_COLUMNS, keep_when_null=True)
            new = [a["run_id"] for a in attempts]
            if new:
                self.con.register("_sbench_new", frame([("run_id", "VARCHAR")], [{"run_id": r} for r in new]))
                try:
                    self.con.execute("UPDATE runs SET state = 'SUBMITTED' WHERE state IS NULL AND outcome IS NULL "
                                     "AND run_id IN (SELECT run_id FROM _sbench_new)")
                finally:
                    self.con.unregister("_sbench_new")
            for campaign, ids, at in cancels:
                for job_id in ids:
                    self.con.execute("UPDATE runs SET cancel_requested_at = ? WHERE campaign = ? "
                                     "AND (job_id = ? OR job_dir = ?) AND cancel_requested_at IS DISTINCT FROM ?",
                                     [at, campaign, job_id, job_id, at])
        return problems

    def ensure_spec_rows(self, campaign: Mapping[str, Any], point: Mapping[str, Any],
                         link: Mapping[str, Any], run: Mapping[str, Any]) -> None:
        """Rows for a job dir rendered and submitted by hand (no manifest): insert what is missing,
        never overwrite what a manifest recorded."""
        with self.transaction():
            for table, row in (("campaigns", campaign), ("points", point), ("campaign_points", link),
                               ("runs", run)):
                key = PRIMARY_KEYS[table]
                where = " AND ".join(f"{q(k)} = ?" for k in key)
                if self.con.execute(f"SELECT 1 FROM {q(table)} WHERE {where}", [row[k] for k in key]).fetchall():
                    continue
                self.insert(table, [row])

    # -- status (submit/status API) ------------------------------------------------------------------------
    def point_status(self, campaign: str | None = None,
                     point_ids: Iterable[str] | None = None) -> dict[str, PointStatus]:
        where, params = [], []
        if campaign is not None:
            where.append("campaign = ?")
            params.append(campaign)
        ids = list(point_ids) if point_ids is not None else None
        if ids is not None:
            if not ids:
                return {}
            where.append(f"point_id IN ({', '.join('?' for _ in ids)})")
            params.extend(ids)
        sql = ("SELECT point_id, attempt, outcome, submitted_at, run_id FROM runs"
               + (" WHERE " + " AND ".join(where) if where else "")
               + " ORDER BY point_id, submitted_at NULLS FIRST, attempt, run_id")
        out: dict[str, PointStatus] = {pid: PointStatus(pid) for pid in ids or []}
        for pid, attempt, outcome, _sub, _rid in self.con.execute(sql, params).fetchall():
            st = out.setdefault(pid, PointStatus(pid))
            st.attempts += 1
            if outcome in ("ok", "invalid", "failed"):
                setattr(st, outcome, getattr(st, outcome) + 1)
            else:
                st.pending += 1
            st.last_attempt = max(st.last_attempt, int(attempt or 0))
            st.last_outcome = outcome
        if campaign is not None and ids is None:
            for (pid,) in self.con.execute("SELECT DISTINCT point_id FROM campaign_points WHERE campaign = ?",
                                           [campaign]).fetchall():
                out.setdefault(pid, PointStatus(pid))
        return out

    def next_attempt(self, campaign: str, point_id: str, repeat: int) -> int:
        rows = self.con.execute("SELECT max(attempt) FROM runs WHERE campaign = ? AND point_id = ? AND repeat = ?",
                                [campaign, point_id, repeat]).fetchall()
        return int(rows[0][0] or 0) + 1

    def attempt_rows(self, campaign: str | None = None) -> list[dict[str, Any]]:
        cols = ("run_id, campaign, point_id, repeat, attempt, experiment, executor, job_id, state, outcome, reason, "
                "accounting_source, submitted_at, started_at, ended_at, elapsed_s, node_list, transport, job_dir, "
                "cancel_requested_at")
        sql = f"SELECT {cols} FROM runs" + (" WHERE campaign = ?" if campaign else "")
        return self.fetch_dicts(sql + " ORDER BY campaign, point_id, repeat, attempt", [campaign] if campaign else [])

    def record_probes(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Store one ``sbench probe`` (rows of the ``probes`` table) in one transaction."""
        with self.transaction():
            self.insert("probes", rows)

    def record_fabric(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Store one ``sbench fabric`` run (rows of the ``fabric`` table) in one transaction."""
        with self.transaction():
            self.insert("fabric", [{**r, "measured_at": utc(r.get("measured_at"))} for r in rows])

    # -- references and checks ---------------------------------------------------------------------------
    def references_of(self) -> dict[str, list[dict[str, Any]]]:
        """Campaign -> its recorded references (only campaigns that declare some)."""
        out: dict[str, list[dict[str, Any]]] = {}
        for camp, spec in self.con.execute("SELECT campaign, references_spec FROM campaigns "
                                           "WHERE references_spec IS NOT NULL").fetchall():
            try:
                refs = json.loads(spec)
            except ValueError:
                continue
            if isinstance(refs, list) and refs:
                out[camp] = [r for r in refs if isinstance(r, dict)]
        return out

    def check_inputs(self, campaign: str, metrics: Sequence[str]) -> list[dict[str, Any]]:
        """The campaign's valid point-repeats at their latest attempt: entity, run, outcome and the
        measured *metrics* (see harness.references.check_rows)."""
        cols = [m for m in dict.fromkeys(metrics) if m in _COLUMN_NAMES["measurements"]]
        picked = "".join(f", m.{q(c)}" for c in cols)
        rows = self.fetch_dicts(
            f"""WITH latest AS (
                    SELECT * FROM runs WHERE campaign = ?
                    QUALIFY row_number() OVER (PARTITION BY point_id, repeat ORDER BY attempt DESC) = 1)
                SELECT cp.point_id, cp.repeat, p.entity, r.run_id, r.outcome{picked}
                FROM campaign_points cp JOIN points p USING (point_id)
                     LEFT JOIN latest r ON r.point_id = cp.point_id AND r.repeat = cp.repeat
                     LEFT JOIN measurements m ON m.run_id = r.run_id
                WHERE cp.campaign = ? AND p.valid IS DISTINCT FROM false
                ORDER BY cp.point_id, cp.repeat""", [campaign, campaign])
        for r in rows:
            try:
                r["entity"] = json.loads(r["entity"]) if r["entity"] else {}
            except ValueError:
                r["entity"] = {}
            r["values"] = {c: r.pop(c) for c in cols}
        return rows

    def replace_checks(self, campaign: str, rows: Sequence[Mapping[str, Any]]) -> None:
        self.con.execute("DELETE FROM checks WHERE campaign = ?", [campaign])
        self.insert("checks", [{**r, "selector": to_json(r.get("selector"))} for r in rows])

    def drop_checks_except(self, campaigns: Sequence[str]) -> None:
        """Forget the checks of campaigns that no longer declare references."""
        self.con.execute("DELETE FROM checks WHERE NOT list_contains(?::VARCHAR[], campaign)", [list(campaigns)])

    def check_results(self, campaign: str) -> list[dict[str, Any]]:
        """The campaign's checks, failures first."""
        return self.fetch_dicts(
            """SELECT c.*, p.model_name, p.number_gpus, p.batch_size FROM checks c LEFT JOIN points p USING (point_id)
               WHERE c.campaign = ?
               ORDER BY CASE c.status WHEN 'fail' THEN 0 WHEN 'missing' THEN 1 ELSE 2 END, c.metric,
                        p.model_name, p.number_gpus, p.batch_size, c.point_id, c.repeat""", [campaign])

    # -- the report's queries ------------------------------------------------------------------------------
    @staticmethod
    def _scope(column: str, campaign: str | None, word: str = "WHERE") -> tuple[str, list[Any]]:
        return (f" {word} {column} = ?", [campaign]) if campaign else ("", [])

    def run_total(self) -> int:
        return int(self.con.execute("SELECT count(*) FROM runs").fetchall()[0][0])

    def campaign_names(self) -> list[str]:
        """Every campaign with a recorded campaign row or a run."""
        return [r[0] for r in self.con.execute(
            "SELECT campaign FROM campaigns UNION SELECT campaign FROM runs WHERE campaign IS NOT NULL "
            "ORDER BY 1").fetchall()]

    def campaign_rows(self, campaign: str | None = None) -> list[dict[str, Any]]:
        where, params = self._scope("campaign", campaign)
        return self.fetch_dicts(f"SELECT * FROM campaigns{where} ORDER BY campaign", params)

    def outcome_counts(self, campaign: str | None = None) -> dict[str, int]:
        where, params = self._scope("campaign", campaign)
        return {r["o"]: int(r["n"]) for r in self.fetch_dicts(
            f"SELECT coalesce(outcome, 'pending') AS o, count(*) AS n FROM runs{where} GROUP BY 1", params)}

    def report_measurements(self, campaign: str | None = None) -> list[dict[str, Any]]:
        """Every measurements row, with its run's reason, in the report's order."""
        where, params = self._scope("m.campaign", campaign)
        return self.fetch_dicts(
            f"""SELECT m.*, r.reason AS run_reason FROM measurements m JOIN runs r USING (run_id){where}
                ORDER BY m.model_name, m.experiment, m.number_gpus, m.batch_size, m.ended_at, m.run_id""", params)

    def report_runs(self, campaign: str | None = None) -> list[dict[str, Any]]:
        where, params = self._scope("r.campaign", campaign)
        return self.fetch_dicts(
            f"""SELECT r.run_id, r.campaign, r.point_id, r.repeat, r.attempt, r.experiment, r.outcome, r.reason,
                       r.elapsed_s, p.model_name, p.batch_size, p.number_gpus
                FROM runs r LEFT JOIN points p USING (point_id){where}
                ORDER BY p.model_name, r.experiment, p.number_gpus, p.batch_size, r.repeat, r.attempt, r.run_id""",
            params)

    def stage_seconds(self, campaign: str | None = None) -> list[dict[str, Any]]:
        """Per run and stage: the slowest host/rank, summed over trials. A stage that started and never
        ended (the run died in it) counts until that host's last sample and is marked unfinished."""
        where, params = self._scope("r.campaign", campaign)
        return self.fetch_dicts(
            f"""WITH last AS (SELECT run_id, host, max(t_wall) AS t FROM samples GROUP BY ALL),
                     per_trial AS (
                         SELECT s.run_id, s.stage, s.trial,
                                max(coalesce(s.duration_s, CASE WHEN s.end_wall IS NULL THEN l.t - s.start_wall END))
                                    AS seconds,
                                bool_or(s.duration_s IS NULL) AS unfinished
                         FROM stages s JOIN runs r USING (run_id) LEFT JOIN last l USING (run_id, host){where}
                         GROUP BY ALL)
                SELECT run_id, stage, sum(seconds) AS seconds, bool_or(unfinished) AS unfinished
                FROM per_trial GROUP BY ALL HAVING sum(seconds) IS NOT NULL""", params)

    def gpu_sample_count(self, campaign: str | None = None) -> int:
        where, params = self._scope("r.campaign", campaign, "AND")
        return int(self.con.execute("SELECT count(*) FROM samples s JOIN runs r USING (run_id) "
                                    f"WHERE s.kind = 'gpu'{where}", params).fetchall()[0][0])

    _REPORT_RUN = ("SELECT r.run_id, r.campaign, r.experiment, r.outcome, r.reason, r.elapsed_s, r.train_start_wall, "
                   "r.train_end_wall, r.warmup_end_wall, r.sample_rows, p.model_name, p.batch_size, p.number_gpus, "
                   "m.window_start_wall, m.window_end_wall "
                   "FROM runs r LEFT JOIN points p USING (point_id) LEFT JOIN measurements m USING (run_id)")

    def report_run(self, run_id: str | None = None, *, campaign: str | None = None,
                   pick: str = "longest_ok") -> dict[str, Any] | None:
        """One run for the utilisation panels: *run_id*; else the longest ok run (``longest_ok``) or the
        run with the most samples (``most_samples``), in *campaign* if given."""
        if run_id is not None:
            rows = self.fetch_dicts(f"{self._REPORT_RUN} WHERE r.run_id = ?", [run_id])
        else:
            extra, params = self._scope("r.campaign", campaign, "AND")
            if pick == "longest_ok":
                length = ("coalesce(r.elapsed_s, epoch(r.ended_at) - epoch(r.started_at), "
                          "r.train_end_wall - r.train_start_wall)")
                sql = f"{self._REPORT_RUN} WHERE r.outcome = 'ok'{extra} ORDER BY {length} DESC NULLS LAST, r.run_id"
            else:
                sql = f"{self._REPORT_RUN} WHERE r.sample_rows > 0{extra} ORDER BY r.sample_rows DESC, r.run_id"
            rows = self.fetch_dicts(sql + " LIMIT 1", params)
        return rows[0] if rows else None

    def some_run_ids(self, n: int) -> list[str]:
        return [r[0] for r in self.con.execute("SELECT run_id FROM runs ORDER BY run_id LIMIT ?", [n]).fetchall()]

    def run_traces(self, run_id: str, buckets: int) -> list[dict[str, Any]]:
        """A run's samples averaged into at most *buckets* time buckets per host, kind and device."""
        return self.fetch_dicts(
            """WITH s AS (
                   SELECT host, kind, device, t_wall, gpu_util, cpu_pct, rss_mb,
                          100.0 * mem_used_mb / nullif(mem_total_mb, 0) AS gpu_mem_pct,
                          coalesce(t_rel, t_wall - min(t_wall) OVER ()) AS x
                   FROM samples WHERE run_id = ?),
               span AS (SELECT min(x) AS lo, greatest(max(x) - min(x), 1e-9) AS width FROM s)
               SELECT host, kind, device, avg(x) AS x, avg(t_wall - x) AS offset, avg(gpu_util) AS gpu_util,
                      avg(gpu_mem_pct) AS gpu_mem_pct, avg(cpu_pct) AS cpu_pct, max(rss_mb) AS rss_mb
               FROM s, span
               GROUP BY host, kind, device, least(floor((x - lo) / width * ?), ? - 1)
               ORDER BY host, kind, device, x""", [run_id, buckets, buckets])

    def fabric_rows(self, last: int = 20) -> list[dict[str, Any]]:
        """The rows of the *last* fabric runs that measured something, oldest run first."""
        return self.fetch_dicts(
            """SELECT * FROM fabric WHERE fabric_id IN (
                   SELECT fabric_id FROM fabric WHERE bytes IS NOT NULL GROUP BY fabric_id
                   ORDER BY max(measured_at) DESC LIMIT ?)
               ORDER BY fabric_id, op, bytes""", [last])

    def overhead_rows(self, campaign: str | None = None) -> list[dict[str, Any]]:
        """``run_overhead`` rows with the run's labels, most time outside training first."""
        sql = """SELECT o.*, r.campaign, r.point_id, r.repeat, r.attempt, r.outcome, p.model_name, p.number_gpus,
                        p.batch_size
                 FROM run_overhead o JOIN runs r USING (run_id) LEFT JOIN points p USING (point_id)"""
        params = [campaign] if campaign else []
        return self.fetch_dicts(sql + (" WHERE r.campaign = ?" if campaign else "")
                                + " ORDER BY o.outside_train_s DESC NULLS LAST, o.run_id, o.host", params)

    def compare_side(self, campaign: str | None, filters: Mapping[str, str]) -> dict[str, list[dict[str, Any]]]:
        """Valid measurements of ok runs selected by *campaign* and *filters*, by point_id (``sbench compare``).

        A filter names a column of ``measurements`` (the entity fields, ``experiment``...) or of
        ``environment`` (``git_commit``, ``torch``, ...: any host of the run matches)."""
        env_cols = {c for c, t in SCHEMA["environment"] if t == "VARCHAR" and c != "run_id"}
        m_cols = {c for c, _ in SCHEMA["measurements"]}
        where, params = ["m.is_valid", "r.outcome = 'ok'"], []
        if campaign is not None:
            where.append("r.campaign = ?")
            params.append(campaign)
        for key, value in filters.items():
            if key in env_cols:
                where.append(f"EXISTS (SELECT 1 FROM environment e WHERE e.run_id = m.run_id AND e.{q(key)} = ?)")
            elif key in m_cols:
                where.append(f"CAST(m.{q(key)} AS VARCHAR) = ?")
            else:
                raise InputError(f"compare: unknown filter {key!r}; use campaign, a point field (model_name, "
                                 f"number_gpus, ...) or an environment column ({', '.join(sorted(env_cols))})")
            params.append(value)
        rows = self.fetch_dicts(f"SELECT m.* FROM measurements m JOIN runs r USING (run_id) WHERE {' AND '.join(where)} "
                                "ORDER BY m.point_id, m.ended_at, m.run_id", params)
        out: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            out.setdefault(r["point_id"], []).append(r)
        return out

    def job_dirs(self, campaign: str | None = None) -> set[str]:
        """The job dir of every attempt recorded (of one campaign, or all)."""
        sql = "SELECT job_dir FROM runs WHERE job_dir IS NOT NULL" + (" AND campaign = ?" if campaign else "")
        return {r[0] for r in self.con.execute(sql, [campaign] if campaign else []).fetchall()}

    def status_rows(self, campaign: str | None = None) -> list[dict[str, Any]]:
        sql = """
            WITH latest AS (
                SELECT * EXCLUDE (_rn) FROM (
                    SELECT r.*, row_number() OVER (PARTITION BY campaign, point_id, repeat
                                                   ORDER BY attempt DESC) AS _rn FROM runs r)
                WHERE _rn = 1)
            SELECT ps.campaign, ps.point_id, ps.repeat, ps.valid, p.reasons AS point_reasons, p.model_name,
                   ps.attempts, ps.ok, ps.invalid, ps.failed, ps.pending,
                   l.attempt AS last_attempt, l.job_id, l.state, l.outcome, l.reason, l.submitted_at,
                   l.started_at, l.ended_at, l.job_dir, o.startup_s, o.outside_train_s, o.outside_train_fraction,
                   o.prepared_in_job
            FROM point_status ps LEFT JOIN points p USING (point_id)
                 LEFT JOIN latest l ON l.campaign = ps.campaign AND l.point_id = ps.point_id AND l.repeat = ps.repeat
                 LEFT JOIN (SELECT run_id, max(startup_s) AS startup_s, max(outside_train_s) AS outside_train_s,
                                   max(outside_train_fraction) AS outside_train_fraction,
                                   bool_or(prepared_in_job) AS prepared_in_job
                            FROM run_overhead GROUP BY run_id) o ON o.run_id = l.run_id
        """
        params: list[Any] = []
        if campaign:
            sql += " WHERE ps.campaign = ?"
            params.append(campaign)
        return self.fetch_dicts(sql + " ORDER BY ps.campaign, ps.point_id, ps.repeat", params)

    # -- collect internals ---------------------------------------------------------------------------------
    def run_counts(self) -> tuple[dict[str, int], dict[str, int]]:
        """Runs per outcome ('pending' for none yet) and per accounting source ('none')."""
        outcomes = self.con.execute("SELECT coalesce(outcome, 'pending'), count(*) FROM runs GROUP BY ALL "
                                    "ORDER BY 1").fetchall()
        sources = self.con.execute("SELECT coalesce(accounting_source, 'none'), count(*) FROM runs GROUP BY ALL "
                                   "ORDER BY 1").fetchall()
        return {k: int(v) for k, v in outcomes}, {k: int(v) for k, v in sources}

    def run_index(self) -> dict[str, dict[str, Any]]:
        """What collect needs to decide whether a run changed."""
        rows = self.fetch_dicts("SELECT run_id, campaign, point_id, repeat, attempt, job_dir, executor, job_id, "
                                "state, outcome, fingerprint, accounting_source, cancel_requested_at FROM runs")
        return {r["run_id"]: r for r in rows}

    def replace_runs(self, runs: Sequence[Mapping[str, Any]]) -> None:
        """Write collect's full view of *runs* (manifest columns included) over any existing rows."""
        if not runs:
            return
        cols = [c for c, _ in SCHEMA["runs"] if c != "run_id"]
        self._upsert("runs", runs, cols)

    def next_sample_file_id(self) -> int:
        """The first unused ``sample_files.file_id``."""
        return int(self.con.execute("SELECT coalesce(max(file_id) + 1, 0) FROM sample_files").fetchall()[0][0])

    def load_samples(self, paths: Sequence[str], first_file_id: int,
                     rejects: bool = True) -> tuple[int, list[tuple[str, int, str]]]:
        """Bulk-load sample CSVs into ``sample_rows`` with DuckDB's reader, one scan over all *paths*; the
        rows of ``paths[i]`` get ``file_id = first_file_id + i`` (the caller records the matching
        ``sample_files`` rows). Returns the row count and, with *rejects*, the rejected lines as (path,
        line, reason), one reason per line. Without *rejects* a bad line is skipped all the same, at less
        cost (the caller compares each file's rows with the count its writer recorded, and asks
        :meth:`sample_rejects` why where they differ). Touches nothing but the connection, so it may run
        in a helper thread while the caller does other (non-database) work."""
        if not paths:
            return 0, []
        names = [c for c, _ in SCHEMA["sample_rows"] if c != "file_id"]
        # Row order is meaningless here (every row carries its file and time): let each thread append
        # what it parsed without re-establishing the files' order.
        self.con.execute("SET preserve_insertion_order = false")
        self.con.execute("SET enable_progress_bar = false")  # a long load would draw DuckDB's own bar on stdout
        try:
            n = self.con.execute(
                f"""INSERT INTO sample_rows (file_id, {", ".join(names)})
                    SELECT CAST(file_index AS INTEGER) + {int(first_file_id)}, {", ".join(names)}
                    FROM {_sample_csv(rejects)}""", {"files": [str(p) for p in paths]}).fetchall()[0][0]
            found = self._take_rejects() if rejects else []
        except duckdb.Error as exc:
            raise CollectError(f"loading samples failed: {exc}") from None
        finally:
            self.con.execute("SET preserve_insertion_order = true")
        return int(n), found

    def sample_rejects(self, paths: Sequence[str]) -> list[tuple[str, int, str]]:
        """The lines of sample CSVs that :meth:`load_samples` skips, as (path, line, reason): the files are
        read again, nothing is written."""
        if not paths:
            return []
        try:
            # Every column named, so that each value is converted (count(*) alone would convert none).
            every = ", ".join(f"count({q(c)})" for c in _SAMPLE_READ_TYPES)
            self.con.execute(f"SELECT {every} FROM {_sample_csv(True)}", {"files": [str(p) for p in paths]}).fetchall()
            return self._take_rejects()
        except duckdb.Error as exc:
            raise CollectError(f"reading samples failed: {exc}") from None

    def _take_rejects(self) -> list[tuple[str, int, str]]:
        found = self.con.execute(
            """SELECT s.file_path, e.line, e.column_idx, e.error_type, e.error_message
               FROM _sbench_rej AS e JOIN _sbench_rej_scan AS s USING (scan_id, file_id)
               ORDER BY 1, 2, 3, 4, 5""").fetchall()
        self.con.execute("DROP TABLE IF EXISTS _sbench_rej")
        self.con.execute("DROP TABLE IF EXISTS _sbench_rej_scan")
        return _reject_reasons(found)

    def sample_stats(self, windows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Per (run, host, kind, device) statistics of the samples inside each run's measured window
        (``run_id``, ``start``, ``end``; NULL bounds = unbounded), plus rows counted outside it."""
        if not windows:
            return []
        tbl = frame([("run_id", "VARCHAR"), ("w_start", "DOUBLE"), ("w_end", "DOUBLE")],
                    [{"run_id": w["run_id"], "w_start": w.get("start"), "w_end": w.get("end")} for w in windows])
        self.con.register("_sbench_win", tbl)
        try:
            # Aggregate on the small integer key (one file = one run and host) split by in/out of the
            # window (cheaper than filtered aggregates), GPU and process rows apart (each kind updates only
            # its own aggregates; the GPU rows' kind is known, so not hashed), fold the split, then name the
            # files.
            return self.fetch_dicts("""
                WITH w AS (SELECT f.file_id, coalesce(x.w_start, '-infinity'::DOUBLE) AS lo,
                                  coalesce(x.w_end, 'infinity'::DOUBLE) AS hi
                           FROM sample_files f JOIN _sbench_win x USING (run_id)),
                     g AS (
                    SELECT file_id, 'gpu'::sample_kind AS kind, device,
                           coalesce(s.t_wall BETWEEN w.lo AND w.hi, false) AS inw,
                           count(*) AS n,
                           avg(gpu_util) AS gpu_util,
                           avg(100.0 * mem_used_mb / nullif(mem_total_mb, 0)) AS mem_util,
                           max(100.0 * mem_used_mb / nullif(mem_total_mb, 0)) AS mem_util_peak,
                           avg(power_w) AS power_w,
                           avg(100.0 * power_w / nullif(power_limit_w, 0)) AS power_pct,
                           NULL::DOUBLE AS cpu_pct, NULL::DOUBLE AS mem_pct, NULL::DOUBLE AS rss_mb_max
                    FROM sample_rows s JOIN w USING (file_id)
                    WHERE kind = 'gpu'
                    GROUP BY file_id, device, inw
                    UNION ALL
                    SELECT file_id, kind, device, coalesce(s.t_wall BETWEEN w.lo AND w.hi, false) AS inw,
                           count(*) AS n, NULL, NULL, NULL, NULL, NULL,
                           avg(cpu_pct), avg(mem_pct), max(rss_mb)
                    FROM sample_rows s JOIN w USING (file_id)
                    WHERE kind <> 'gpu'
                    GROUP BY ALL),
                     a AS (
                    SELECT file_id, kind, device, CAST(sum(n) AS BIGINT) AS rows_all,
                           CAST(coalesce(sum(n) FILTER (WHERE inw), 0) AS BIGINT) AS samples,
                           max(gpu_util) FILTER (WHERE inw) AS gpu_util,
                           max(mem_util) FILTER (WHERE inw) AS mem_util,
                           max(mem_util_peak) FILTER (WHERE inw) AS mem_util_peak,
                           max(power_w) FILTER (WHERE inw) AS power_w,
                           max(power_pct) FILTER (WHERE inw) AS power_pct,
                           max(cpu_pct) FILTER (WHERE inw) AS cpu_pct,
                           max(mem_pct) FILTER (WHERE inw) AS mem_pct,
                           max(rss_mb_max) AS rss_mb_max
                    FROM g GROUP BY file_id, kind, device)
                SELECT f.run_id, f.host, CAST(a.kind AS VARCHAR) AS kind, a.device, a.rows_all, a.samples,
                       a.gpu_util, a.mem_util, a.mem_util_peak, a.power_w, a.power_pct, a.cpu_pct, a.mem_pct,
                       a.rss_mb_max
                FROM a JOIN sample_files f USING (file_id)
                ORDER BY f.run_id, f.host, a.kind, a.device""")
        finally:
            self.con.unregister("_sbench_win")

    def get_metadata(self, key: str) -> str | None:
        rows = self.con.execute("SELECT value FROM metadata WHERE key = ?", [key]).fetchall()
        return rows[0][0] if rows else None

    def set_metadata(self, key: str, value: str) -> None:
        self._upsert("metadata", [{"key": key, "value": value}], ["value"])

    # -- query ---------------------------------------------------------------------------------------------
    def query(self, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run user SQL; errors become :class:`InputError` (exit 2) with DuckDB's message."""
        try:
            cur = self.con.execute(sql)
            if cur.description is None:
                return [], []
            return [d[0] for d in cur.description], cur.fetchall()
        except duckdb.Error as exc:
            raise InputError(f"SQL error: {exc}") from None


def _sample_csv(rejects: bool) -> str:
    """DuckDB's reader of the sample CSVs in ``$files`` (docs/job-directory.md), skipping a line that does
    not fit; with *rejects*, recording why in ``_sbench_rej``/``_sbench_rej_scan``."""
    columns = "{" + ", ".join(f"'{c}': '{t}'" for c, t in _SAMPLE_READ_TYPES.items()) + "}"
    keep = ", store_rejects = true, rejects_table = '_sbench_rej', rejects_scan = '_sbench_rej_scan'" \
        if rejects else ""
    return (f"""read_csv($files, columns = {columns}, header = true, auto_detect = false, delim = ',',
                         quote = '"', escape = '"', ignore_errors = true{keep})""")


def _reject_reasons(found: Sequence[tuple[Any, ...]]) -> list[tuple[str, int, str]]:
    """DuckDB's rejects, (path, line, column_idx, error_type, message) sorted, as one reason per bad value
    or, for a line whose shape is wrong (too few/many columns, bad quoting, ...), one reason for the line
    (the reader also lists each column it then could not fill, or the values it misread; those are
    consequences, not causes)."""
    by_line: dict[tuple[str, int], list[tuple[Any, ...]]] = {}
    for path, line, col, etype, msg in found:
        by_line.setdefault((str(path), int(line)), []).append((col, etype, msg))
    out: list[tuple[str, int, str]] = []
    for (path, line), errs in by_line.items():
        shape = [e for e in errs if e[1] not in _CSV_VALUE_ERRORS]
        for _col, etype, msg in (shape[:1] or errs):
            out.append((path, line, f"{etype}: {msg}"))
    return list(dict.fromkeys(out))


def point_row(point_id: str, experiment: Any, entity: Any, valid: Any, reasons: Any, notes: Any) -> dict[str, Any]:
    ent = entity if isinstance(entity, Mapping) else {}
    row: dict[str, Any] = {"point_id": point_id, "experiment": experiment,
                           "valid": None if valid is None else bool(valid),
                           "reasons": [str(r) for r in reasons] if isinstance(reasons, list) else None,
                           "notes": [str(n) for n in notes] if isinstance(notes, list) else None,
                           "entity": to_json(dict(ent)) if ent else None}
    row.update(entity_values(ent))
    return row


def run_id_of(campaign: str, point_id: str, repeat: int, attempt: int) -> str:
    return f"{campaign}/{point_id}.r{repeat}.a{attempt}"


def key_int(value: Any, name: str) -> int:
    """A repeat/attempt/task number of a manifest line: an INTEGER, or ``ValueError`` (the line is
    reported as malformed instead of aborting the collect)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"{name} must be an integer, got {value!r}"[:200])
    n = int(value)
    if not 0 <= n < 2**31:
        raise ValueError(f"{name} must be an integer in [0, 2^31), got {str(value)[:40]}")
    return n


def attempt_row(ev: Mapping[str, Any]) -> dict[str, Any]:
    campaign, pid = _to_str(ev["campaign"]), _to_str(ev["point_id"])
    repeat, attempt = key_int(ev.get("repeat") or 0, "repeat"), key_int(ev["attempt"], "attempt")
    task = ev.get("array_task_id")
    task = None if task is None else key_int(task, "array_task_id")
    return {"run_id": run_id_of(campaign, pid, repeat, attempt), "campaign": campaign, "point_id": pid,
            "repeat": repeat, "attempt": attempt, "experiment": ev.get("experiment"),
            "job_dir": None if ev.get("job_dir") is None else str(ev["job_dir"]),
            "executor": ev.get("executor"), "job_id": None if ev.get("job_id") is None else str(ev["job_id"]),
            "array_job_id": None if ev.get("array_job_id") is None else str(ev["array_job_id"]),
            "array_task_id": task, "submit_reason": ev.get("reason"),
            "submitted_at": utc(ev.get("submitted_at"))}
