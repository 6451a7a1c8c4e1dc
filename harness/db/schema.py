"""The results database's schema: every table with its typed columns, the primary keys, the views, and the
schema version a database must carry (``metadata.schema_version``).

Tables: ``metadata``, ``campaigns``, ``points`` (entity fields as typed columns), ``campaign_points``,
``runs`` (one per attempt), ``run_hosts``, ``stages``, ``sample_files``, ``sample_rows``, ``ranks``,
``errors``, ``trials``, ``measurements``, ``environment``, ``memory``, ``profile_ops``, ``checks``, ``probes``,
``fabric``, ``rank_scores``, ``preflight``, ``search_decisions``; views ``samples``, ``latest_measurements``,
``run_summary``, ``stage_durations``, ``run_overhead``, ``point_status``, ``point_stability``, ``host_health``,
``measured_peaks``, ``measured_mfu``.

Samples are stored compactly: ``sample_files`` has one row per loaded ``samples.<host>.csv``
(``file_id``, ``run_id``, ``host``, its ``path`` and ``t0``, the run's training start); ``sample_rows``
has the file's rows keyed by that small integer, ``kind`` as the ENUM ``sample_kind`` ('gpu', 'proc', 'cpu', 'host') and
no per-row run id, host or derived column. The view ``samples`` joins them back into the documented
columns (``run_id``, ``host``, ``kind``, ``device``, ``t_wall``, ``t_rel`` = ``t_wall - t0``, ``t_mono``,
the metrics, ``nprocs``, ``energy_j``, ``foreign_procs``): query ``samples``; the two tables are storage.
"""

from __future__ import annotations

from harness.contract.errors import CollectError
from harness.contract.formats import SAMPLE_KINDS, Stage
from harness.contract.records import PREDICTION_COLUMNS
from harness.contract.stability import rating_sql
from harness.spec.catalog import BENCHMARK_PROPERTIES, DERIVED_PROPERTIES, EXPERIMENTS, STABILITY_PROPERTIES

# 2: samples became a view over sample_files + sample_rows; 3: environment provenance; 4: the run_overhead view;
# 5: FLOPs and MFU columns in measurements; 6: references and checks, exact train tokens and rank-0 CPU columns,
# ranks.cpu_util_pct; 7: DeepSpeed ZeRO and QLoRA entity columns; 8: trainer (entity column) and the trainer
# environment's packages; 9: shared hosts (runs.overlapped_with, run_hosts.held_*_wall,
# measurements.shared_host and overlapped_with); 10: what ran in measurements (effective_torch_dtype,
# attn_implementation, adjustments); 11: rank 0's step times in measurements (steps_timed, step_time_median,
# step_time_cv) and the point_stability view; energy (sample_rows.energy_j and the 'cpu' sample kind;
# measurements.energy_joules, energy_source, dataset_tokens_per_joule, slurm_consumed_energy_joules);
# the measured window in steps and the precision auto-stop's statistics (measurements.window_steps,
# window_start_step, window_end_step, steady_step_time_cv, ci_rel_halfwidth); 12: measurements.gpu_energy_joules
# (the GPUs' NVML counter over the window; NULL where energy_source is not nvml), step_time_mean and step_time_mad
# (compare's robust per-run evidence); the measured window's exact dataset tokens and the image tokens among them
# (measurements.dataset_tokens, dataset_image_tokens); 13: the host's other load (the 'host' sample kind,
# sample_rows.foreign_procs; measurements.host_other_cpu_pct, gpu_foreign_processes, host_busy), which
# point_stability leaves out like a shared host; campaigns.repeats_spec (the report's repeats per point);
# 14: profiled runs (runner.profile: runs.profiled, runs.profile_files, measurements.profiled, which compare, check
# and point_stability leave out) and the profile_ops table (their step breakdown and top operators);
# 15: campaigns beyond one cluster (campaigns.cluster, partitions, origin and imported: sbench import's campaigns,
# exports and the reference's published measurements; measurements.extra, a published file's columns sbench has
# none for) and the container a run ran in (environment.container_runtime, container_image, container_digest; the
# columns marked "step exchange", docs/exchange.md);
# 16: cluster health (CLUSTER_HEALTH_* below): the rank_scores and preflight tables, measurements.straggler and
# straggler_ranks, point_stability leaving straggler runs out, the host_health, measured_peaks and measured_mfu
# views;
# 17: adaptive campaigns (search:): the search_decisions table and campaigns.search_spec;
# 18: measurements.host_window_coverage (the share of the measured window the host samples cover) and
# mfu_peak_source (MFU against the hosts' measured peak where preflight measured them); host_health
# leaves the rank scores of runs on a busy host out (a straggler there is no evidence against the host);
# 19: what a measurement costs (measurements.price_per_gpu_hour, the partition's, and cost_per_million_tokens,
# harness.spec.cost);
# 20: what submit predicted of each run before sending it (runs.predicted_seconds, predicted_low_s,
# predicted_high_s, prediction_source, prediction_basis: harness.spec.predict, from its attempt line) and the
# campaign's budget (campaigns.budget_spec).
# Every column and table since 13 is new and NULL in an older database's rows, so a database of UPGRADE_FROM on is
# upgraded in place.
SCHEMA_VERSION = 20
# The tables a schema added after UPGRADE_FROM (every other table is in every schema sbench reads).
TABLE_SINCE = {"profile_ops": 14, "rank_scores": 16, "preflight": 16, "search_decisions": 17}
# The oldest schema a database is upgraded from in place (by adding what it lacks: every change since is a new table
# or column); an older one is refused with what to do.
UPGRADE_FROM = 13


KIND_SQL = {"int": "BIGINT", "float": "DOUBLE", "bool": "BOOLEAN", "str": "VARCHAR", "list": "VARCHAR[]"}


def _entity_columns() -> list[tuple[str, str]]:
    """Every entity-space field of every experiment, typed from the catalog's FieldSpecs."""
    cols: dict[str, str] = {}
    for exp in EXPERIMENTS.values():
        for f in exp.fields:
            sql = KIND_SQL[f.kind]
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
        ("repeats_spec", "JSON"),  # the sweep's repeats: {min, max, cv} (NULL: a plain repeats: N), newest word
        # step exchange (these four): the inventory's cluster name (its namespace once exported)
        ("cluster", "VARCHAR"),
        ("partitions", "JSON"),  # what the campaign ran on: each partition's public description (no env, no setup)
        # NULL: submitted here; ORIGINS: imported (sbench import), and from what (IMPORTED's keys)
        ("origin", "VARCHAR"), ("imported", "JSON"),
        ("search_spec", "JSON"),  # the sweep's search: and its grid's points as the search sees them (NULL: none)
        ("budget_spec", "JSON"),  # the sweep's budget: {gpu_hours, allocation_hours} (NULL: none), newest word
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
        ("overlapped_with", "VARCHAR[]"),  # the other runs that held one of its hosts at the same time (db.overlaps)
        ("accounting_source", "VARCHAR"), ("started_at", "TIMESTAMP"), ("ended_at", "TIMESTAMP"),
        ("restarts", "INTEGER"), ("transport", "VARCHAR"), ("transport_by_host", "VARCHAR"),
        ("train_start_wall", "DOUBLE"), ("train_end_wall", "DOUBLE"), ("warmup_end_wall", "DOUBLE"),
        ("global_step", "BIGINT"), ("stopped_by", "VARCHAR"), ("sample_rows", "BIGINT"),
        ("fingerprint", "VARCHAR"), ("collected_at", "TIMESTAMP"),
        ("profiled", "BOOLEAN"), ("profile_files", "VARCHAR[]"),  # runner.profile: this run was profiled; its files
        # what submit predicted of it (harness.contract.records.PREDICTION_COLUMNS; NULL: sent without one)
        ("predicted_seconds", "DOUBLE"), ("predicted_low_s", "DOUBLE"), ("predicted_high_s", "DOUBLE"),
        ("prediction_source", "VARCHAR"), ("prediction_basis", "VARCHAR"),
    ],
    "run_hosts": [
        *_RUN_KEY, ("host", "VARCHAR"), ("machine_rank", "INTEGER"), ("expected", "BOOLEAN"),
        ("seen", "BOOLEAN"), ("has_stages", "BOOLEAN"), ("has_samples", "BOOLEAN"), ("has_result", "BOOLEAN"),
        ("has_environment", "BOOLEAN"), ("has_log", "BOOLEAN"), ("outcome", "VARCHAR"), ("exit_code", "INTEGER"),
        ("signal", "VARCHAR"), ("reason", "VARCHAR"), ("started_wall", "DOUBLE"), ("ended_wall", "DOUBLE"),
        ("transport", "VARCHAR"), ("nccl_net", "VARCHAR"),
        ("held_start_wall", "DOUBLE"), ("held_end_wall", "DOUBLE"),  # when the run held the host (NULL end: still)
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
        ("rss_mb", "DOUBLE"), ("nprocs", "INTEGER"), ("energy_j", "DOUBLE"), ("foreign_procs", "INTEGER"),
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
        # the run's exact dataset tokens over the window (note 3: every token the model saw, text and image) and
        # the image tokens among them (vision datasets; 0 for text): text-only rates divide the difference
        ("dataset_tokens", "BIGINT"), ("dataset_image_tokens", "BIGINT"),
        ("trials_run", "INTEGER"), ("window_start_wall", "DOUBLE"), ("window_end_wall", "DOUBLE"),
        ("window_s", "DOUBLE"),
        # rank 0's optimizer steps ending inside the window: how many, their median and mean duration (s), their
        # coefficient of variation (stdev / mean) and median absolute deviation (s); compare's within-run
        # evidence (collect.aggregate)
        ("steps_timed", "INTEGER"), ("step_time_median", "DOUBLE"), ("step_time_mean", "DOUBLE"),
        ("step_time_cv", "DOUBLE"), ("step_time_mad", "DOUBLE"),
        # the window in steps; under auto-stop method precision its step times' CV and the 95 % interval's
        # relative half-width (rank.0.json steady_state)
        ("window_steps", "BIGINT"), ("window_start_step", "BIGINT"), ("window_end_step", "BIGINT"),
        ("steady_step_time_cv", "DOUBLE"), ("ci_rel_halfwidth", "DOUBLE"),
        ("gpu_devices", "INTEGER"), ("gpu_samples", "BIGINT"), ("proc_samples", "BIGINT"),
        ("world_size", "INTEGER"), ("transport", "VARCHAR"), ("notes", "VARCHAR[]"),
        # what ran (the runner's rank files): torch_dtype (an entity column) is what the point asked
        ("effective_torch_dtype", "VARCHAR"), ("attn_implementation", "VARCHAR"), ("adjustments", "JSON"),
        *[(p, "DOUBLE") for p in DERIVED_PROPERTIES],
        # memory: measured (rank 0's tensors after its last recorded optimizer step; the device peak over
        # ranks, CUDA only) beside harness.spec.memory's prediction from spec.json
        ("memory_peak_bytes", "BIGINT"), ("activation_bytes", "BIGINT"), ("activation_error", "DOUBLE"),
        ("params_bytes", "BIGINT"), ("grads_bytes", "BIGINT"),
        ("optimizer_bytes", "BIGINT"), ("predicted_params_bytes", "BIGINT"), ("predicted_grads_bytes", "BIGINT"),
        ("predicted_optimizer_bytes", "BIGINT"), ("predicted_activation_bytes", "BIGINT"),
        ("predicted_total_bytes", "BIGINT"), ("predicted_host_bytes", "BIGINT"), ("device_bytes", "BIGINT"),
        ("predicted_oom", "BOOLEAN"),
        # energy over the measured window (the samples' energy_j: nvml = the GPUs in use, rapl = the CPU
        # packages of a CPU partition's hosts) and SLURM's own figure for the whole job (sacct ConsumedEnergyRaw)
        ("energy_joules", "DOUBLE"), ("gpu_energy_joules", "DOUBLE"), ("energy_source", "VARCHAR"),
        ("dataset_tokens_per_joule", "DOUBLE"),
        ("slurm_consumed_energy_joules", "DOUBLE"),
        # the partition's price of one device an hour, and a million dataset tokens at the measured throughput
        ("price_per_gpu_hour", "DOUBLE"), ("cost_per_million_tokens", "DOUBLE"),
        ("shared_host", "BOOLEAN"), ("overlapped_with", "VARCHAR[]"),  # runs.overlapped_with
        # the host's other load over the window (the samples' host and gpu rows): the CPU share of the busiest
        # host used outside the run (percent of its capacity), the most processes not the run's on one of its
        # GPUs, and whether either passed runner.host_busy_cpu (or any such GPU process): a busy host
        ("host_other_cpu_pct", "DOUBLE"), ("gpu_foreign_processes", "INTEGER"), ("host_busy", "BOOLEAN"),
        ("profiled", "BOOLEAN"),  # measured under the profiler (runner.profile): never compared, checked or in a CV
        *ENTITY_COLUMNS,
        ("extra", "JSON"),  # step exchange: an imported published file's columns sbench has none for (else NULL)
        # (schema step: cluster health) a rank scored under runner.straggler_score (rank_scores): the run is a
        # straggler run, and which ranks were flagged, as host:rank
        ("straggler", "BOOLEAN"), ("straggler_ranks", "VARCHAR[]"),
        # (schema 18) the share of the measured window the host rows cover (the least of the hosts'), which
        # host_other_cpu_pct averages
        ("host_window_coverage", "DOUBLE"),
        # (schema 18) what mfu (and peak_tflops) is set against: measured (the run's hosts' sbench preflight at its
        # dtype, the measured_peaks view), inventory (the partition's peak_tflops) or datasheet (gpu_peaks.yaml)
        ("mfu_peak_source", "VARCHAR"), ("mfu_peak_dtype", "VARCHAR"),  # and the dtype that peak is read for
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
        # step exchange: the container the node runner ran in (runner.envcapture.container): pyxis/enroot,
        # apptainer, podman, docker; the image as asked or found, and its digest where known without reading it
        ("container_runtime", "VARCHAR"), ("container_image", "VARCHAR"), ("container_digest", "VARCHAR"),
    ],
    # harness.runner.memsnap: each rank's memory at fixed phases of recorded steps.
    "memory": [
        *_RUN_KEY, ("rank", "INTEGER"), ("host", "VARCHAR"), ("step", "BIGINT"), ("phase", "VARCHAR"),
        ("t_wall", "DOUBLE"), ("params_bytes", "BIGINT"), ("trainable_bytes", "BIGINT"), ("grads_bytes", "BIGINT"),
        ("optimizer_bytes", "BIGINT"), ("cuda_allocated_bytes", "BIGINT"), ("cuda_peak_bytes", "BIGINT"),
        ("cuda_reserved_bytes", "BIGINT"), ("rss_bytes", "BIGINT"),
    ],
    # A profiled run's trace per rank (harness.collect.profile): kind 'phase' rows split its steps' time into data,
    # forward, backward, optimizer, communication_exposed, communication_overlapped, idle and other (their shares
    # add up to 1; before schema 18 one communication row stood for both); kind 'op' (CPU) and
    # 'kernel' (GPU) rows are its top operators by self time. Seconds are summed over the profiled steps.
    "profile_ops": [
        *_RUN_KEY, ("host", "VARCHAR"), ("rank", "INTEGER"), ("kind", "VARCHAR"), ("name", "VARCHAR"),
        ("calls", "BIGINT"), ("self_s", "DOUBLE"), ("total_s", "DOUBLE"), ("share", "DOUBLE"), ("steps", "INTEGER"),
        ("step_s", "DOUBLE"),
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
    # a search's newest decision about each point of its campaign (the manifest's search lines; harness.spec.search)
    "search_decisions": [
        ("campaign", "VARCHAR"), ("point_id", "VARCHAR"), ("phase", "VARCHAR"), ("action", "VARCHAR"),
        ("reason", "VARCHAR"), ("repeat", "INTEGER"), ("decided_at", "TIMESTAMP"),
    ],
    "fabric": [
        ("fabric_id", "VARCHAR"), ("cluster", "VARCHAR"), ("partition", "VARCHAR"), ("nodes", "INTEGER"),
        ("world_size", "INTEGER"), ("backend", "VARCHAR"), ("enable_roce", "BOOLEAN"), ("op", "VARCHAR"),
        ("bytes", "BIGINT"), ("iters", "INTEGER"), ("time_us", "DOUBLE"), ("algbw_gbps", "DOUBLE"),
        ("busbw_gbps", "DOUBLE"), ("transport_by_host", "JSON"), ("ok", "BOOLEAN"), ("reason", "VARCHAR"),
        ("job_dir", "VARCHAR"), ("measured_at", "TIMESTAMP"),
    ],
}

# ---- schema step: cluster health: tables -----------------------------------------------------------------------
CLUSTER_HEALTH_TABLES: dict[str, list[tuple[str, str]]] = {
    # collect.stragglers: one row per rank of a multi-process run whose ranks timed their own steps.
    "rank_scores": [
        *_RUN_KEY, ("campaign", "VARCHAR"), ("host", "VARCHAR"), ("rank", "INTEGER"), ("steps", "INTEGER"),
        ("own_step_s", "DOUBLE"), ("best_step_s", "DOUBLE"), ("current_step_s", "DOUBLE"),
        ("relative_score", "DOUBLE"), ("individual_score", "DOUBLE"), ("threshold", "DOUBLE"), ("flagged", "BOOLEAN"),
    ],
    # sbench preflight (harness.cluster.preflight): one row per (preflight, host, device, figure); ratio is the
    # value over the partition's median of that figure, flagged when under the threshold.
    "preflight": [
        ("preflight_id", "VARCHAR"), ("cluster", "VARCHAR"), ("partition", "VARCHAR"), ("host", "VARCHAR"),
        ("device", "VARCHAR"), ("device_name", "VARCHAR"), ("dtype", "VARCHAR"), ("figure", "VARCHAR"),
        ("unit", "VARCHAR"), ("value", "DOUBLE"), ("spread", "DOUBLE"), ("reps", "JSON"),
        ("partition_median", "DOUBLE"), ("ratio", "DOUBLE"), ("threshold", "DOUBLE"), ("flagged", "BOOLEAN"),
        ("elapsed_s", "DOUBLE"), ("measured_at", "TIMESTAMP"),
    ],
}
SCHEMA.update(CLUSTER_HEALTH_TABLES)


PRIMARY_KEYS = {"metadata": ("key",), "probes": ("probe_id", "host"), "campaigns": ("campaign",),
                "points": ("point_id",),
                "campaign_points": ("campaign", "point_id", "repeat"), "runs": ("run_id",),
                "measurements": ("run_id",), "sample_files": ("file_id",),
                "search_decisions": ("campaign", "point_id")}


COLUMN_NAMES = {t: frozenset(c for c, _ in cols) for t, cols in SCHEMA.items()}


# Tables whose rows belong to one run and are replaced as a whole when the run changes
# (``sample_rows`` go with their ``sample_files`` row).
RUN_CHILD_TABLES = ("run_hosts", "stages", "sample_files", "ranks", "errors", "trials", "measurements",
                    "environment", "memory", "profile_ops", "rank_scores")


# Types created before the tables.
TYPES = {"sample_kind": "ENUM (" + ", ".join(f"'{k}'" for k in SAMPLE_KINDS) + ")"}


# Columns of ``runs`` that a manifest ``attempt`` line owns; collect owns the rest.
MANIFEST_RUN_COLUMNS = ("campaign", "point_id", "repeat", "attempt", "experiment", "job_dir", "executor", "job_id",
                        "array_job_id", "array_task_id", "submit_reason", "submitted_at", *PREDICTION_COLUMNS)


_HEADLINE = ["train_runtime", "train_tokens_per_second", "dataset_tokens_per_second",
             "gpu_compute_utilization_avg", "gpu_memory_utilization_peak", "f_gpu_oom", "f_no_error"]


def run_overhead_sql(stages: str = "stages") -> str:
    """The ``run_overhead`` view's query over *stages* (a table name or a parenthesised query with the
    columns of ``stages``): a reader that wants a few runs' overhead passes those runs' stages, so that
    the view is not computed over every run."""
    return f"""
        WITH s AS (SELECT run_id, host, stage, trial, start_wall, end_wall, info FROM {stages}
                   WHERE start_wall IS NOT NULL),
        h AS (SELECT run_id, host,
                     -- the node runner's start (its setup stage says when its process started), else
                     -- the host's first event
                     least(min(start_wall), min(CASE WHEN stage = '{Stage.SETUP}' THEN TRY_CAST(
                         json_extract_string(info, '$.runner_start_wall') AS DOUBLE) END)) AS job_start_wall,
                     max(coalesce(end_wall, start_wall)) AS job_end_wall,
                     bool_or(json_extract_string(info, '$.prepared.status') IN ('built', 'rebuilt')
                             OR json_extract_string(info, '$.status_before') IN ('missing', 'stale'))
                         AS prepared_in_job
              FROM s GROUP BY run_id, host),
        t AS (SELECT run_id, host, trial, min(start_wall) AS t0, max(end_wall) AS t1 FROM s
              WHERE stage = '{Stage.TRAIN}' GROUP BY run_id, host, trial),
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
        FROM h LEFT JOIN tt USING (run_id, host)"""


def device_seconds(seconds: str) -> str:
    """SQL: *seconds* (an expression over ``runs r`` joined with ``points p``) times the run's devices (its
    ``number_gpus``; one for a CPU point without GPUs): what a GPU-hour counts (``harness.spec.predict``'s
    ``Prediction.gpu_hours`` too)."""
    return f"{seconds} * greatest(1, coalesce(p.number_gpus, 1))"


def point_status_sql(campaign_points: str = "campaign_points", runs: str = "runs") -> str:
    """The ``point_status`` view's query over *campaign_points* and *runs* (table names, or queries
    with their columns): a reader of one campaign passes that campaign's rows."""
    return f"""
        SELECT cp.campaign, cp.point_id, cp.repeat, p.valid,
               count(r.run_id) AS attempts,
               count(*) FILTER (WHERE r.outcome = 'ok') AS ok,
               count(*) FILTER (WHERE r.outcome = 'invalid') AS invalid,
               count(*) FILTER (WHERE r.outcome = 'failed') AS failed,
               count(*) FILTER (WHERE r.run_id IS NOT NULL AND r.outcome IS NULL) AS pending
        FROM {campaign_points} cp LEFT JOIN points p USING (point_id)
             LEFT JOIN {runs} r ON r.campaign = cp.campaign AND r.point_id = cp.point_id AND r.repeat = cp.repeat
        GROUP BY ALL"""


STABILITY_METRIC = "dataset_tokens_per_second"  # the throughput point_stability rates


def point_stability_sql(measurements: str = "measurements") -> str:
    """The ``point_stability`` view's query over *measurements* (a table name or a parenthesised query with
    its columns): per campaign and point, the valid measurements not taken on a shared host (what
    ``compare`` counts as the point's repeats), their median throughput, its coefficient of variation across
    them (sample stdev / mean; NULL with fewer than two) and that CV's rating (harness.contract.stability)."""
    x = STABILITY_METRIC
    cv = f"(stddev_samp({x}) / nullif(avg({x}), 0))"
    return f"""
        SELECT campaign, point_id, count({x}) AS repeats_measured, median({x}) AS throughput_median,
               {cv} AS throughput_cv, {rating_sql(cv)} AS throughput_stability
        FROM {measurements}
        WHERE is_valid AND NOT coalesce(shared_host, false) AND NOT coalesce(host_busy, false)
              AND NOT coalesce(profiled, false) AND NOT coalesce(straggler, false) AND {x} IS NOT NULL
        GROUP BY campaign, point_id"""


VIEWS: dict[str, str] = {
    # The samples as documented (docs/job-directory.md), one row per CSV row.
    "samples": """
        SELECT f.run_id, f.host, s.kind, s.device, s.t_wall, s.t_wall - f.t0 AS t_rel, s.t_mono, s.gpu_util,
               s.mem_used_mb, s.mem_total_mb, s.power_w, s.power_limit_w, s.cpu_pct, s.mem_pct, s.rss_mb, s.nprocs,
               s.energy_j, s.foreign_procs
        FROM sample_rows s JOIN sample_files f USING (file_id)""",
    # The latest valid measurement of each point (across campaigns): what most analyses want.
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
    # Per run and host, from the stage events: the seconds from the node runner's start (its process's
    # start, which the setup stage records; else the host's first event) to the first train stage, the host's
    # span from then, the train stages' span (per trial, summed), and
    # what is left outside training. prepared_in_job: the job had to generate or tokenize its data.
    "run_overhead": run_overhead_sql(),
    "point_status": point_status_sql(),
    # Per campaign and point: how stable its throughput is across its repeats.
    "point_stability": point_stability_sql(),
}

# ---- schema step: cluster health: views ------------------------------------------------------------------------
CLUSTER_HEALTH_VIEWS: dict[str, str] = {
    # Per host, across campaigns: the runs that held it, the scored runs (a rank of it in rank_scores), how often
    # a rank of it was a straggler, the median of its ranks' relative scores, and its preflights: figures
    # measured, how many under their threshold (a slow device), the lowest ratio to the partition's median.
    "host_health": """
        WITH held AS (SELECT h.host, count(DISTINCT h.run_id) AS runs, count(DISTINCT r.campaign) AS campaigns
                      FROM run_hosts h JOIN runs r USING (run_id) WHERE h.seen GROUP BY h.host),
        per_run AS (SELECT s.host, s.run_id, bool_or(s.flagged) AS flagged, min(s.relative_score) AS relative_score,
                           min(s.individual_score) AS individual_score
                    FROM rank_scores s LEFT JOIN measurements m USING (run_id)
                    WHERE NOT coalesce(m.host_busy, false)
                    GROUP BY s.host, s.run_id),
        scored AS (SELECT host, count(*) AS runs_scored, count(*) FILTER (WHERE flagged) AS straggler_runs,
                          median(relative_score) AS median_relative_score,
                          median(individual_score) AS median_individual_score
                   FROM per_run GROUP BY host),
        checked AS (SELECT host, count(DISTINCT preflight_id) AS preflights,
                           count(DISTINCT preflight_id) FILTER (WHERE flagged) AS slow_preflights,
                           count(*) FILTER (WHERE flagged) AS slow_figures, min(ratio) AS min_preflight_ratio
                    FROM preflight GROUP BY host),
        hosts AS (SELECT host FROM held UNION SELECT host FROM scored UNION SELECT host FROM checked)
        SELECT hosts.host, coalesce(held.runs, 0) AS runs, coalesce(held.campaigns, 0) AS campaigns,
               coalesce(scored.runs_scored, 0) AS runs_scored, coalesce(scored.straggler_runs, 0) AS straggler_runs,
               scored.median_relative_score, scored.median_individual_score,
               coalesce(checked.preflights, 0) AS preflights, coalesce(checked.slow_preflights, 0) AS slow_preflights,
               coalesce(checked.slow_figures, 0) AS slow_figures, checked.min_preflight_ratio,
               coalesce(scored.straggler_runs, 0) + coalesce(checked.slow_preflights, 0) AS flags
        FROM hosts LEFT JOIN held USING (host) LEFT JOIN scored USING (host) LEFT JOIN checked USING (host)
        WHERE hosts.host IS NOT NULL""",
    # Each device's latest preflight matmul figure: its measured peak TFLOP/s at the partition's dtype.
    "measured_peaks": """
        SELECT cluster, partition, host, device, device_name, dtype, value AS peak_tflops, measured_at
        FROM preflight WHERE figure = 'matmul_tflops'
        QUALIFY row_number() OVER (PARTITION BY cluster, partition, host, device
                                   ORDER BY measured_at DESC, preflight_id DESC) = 1""",
    # Each measured run's MFU against its hosts' measured peak (the median of measured_peaks over the devices of
    # the hosts it ran on, at the dtype its peak is read for where known) beside measurements.mfu (which is this
    # figure where the hosts were measured when the run was collected, mfu_peak_source measured).
    "measured_mfu": """
        SELECT m.run_id, m.campaign, m.point_id, m.model_tflops_per_gpu, m.mfu,
               median(p.peak_tflops) AS measured_peak_tflops,
               m.model_tflops_per_gpu / nullif(median(p.peak_tflops), 0) AS mfu_measured
        FROM measurements m JOIN run_hosts h ON h.run_id = m.run_id AND h.seen
             JOIN measured_peaks p ON p.host = h.host AND (m.mfu_peak_dtype IS NULL OR p.dtype = m.mfu_peak_dtype)
        WHERE m.model_tflops_per_gpu IS NOT NULL
        GROUP BY m.run_id, m.campaign, m.point_id, m.model_tflops_per_gpu, m.mfu""",
}
VIEWS.update(CLUSTER_HEALTH_VIEWS)


def q(name: str) -> str:
    """A quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def tables_of(version: int) -> list[str]:
    """The tables a database (or an export) of schema *version* has."""
    return [t for t in SCHEMA if TABLE_SINCE.get(t, UPGRADE_FROM) <= version]
