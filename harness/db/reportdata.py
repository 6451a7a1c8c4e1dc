"""What the report reads: the rows of the HTML page (harness.report.data), of ``sbench compare`` and of
``sbench profile``, from the results database.

Each function takes an open :class:`~harness.db.store.Store` (read-only is enough) and returns plain
rows (dicts) or counts. With *campaign*, a query keeps that campaign's rows; without, every campaign's.
The store owns the schema and the connection; the questions only the report asks live here, and what the
report makes of the rows (which measurements it leaves out and why, the verdicts) lives in harness.report.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from harness.contract.errors import InputError
from harness.contract.exchange import ORIGIN_ADO_CSV

from .schema import SCHEMA, device_seconds, point_stability_sql, q, run_overhead_sql
from .store import Store
from .values import from_json

Scope = str | Sequence[str] | None  # one campaign, several (report --compare A B), or every one (None)


def _scope(column: str, campaign: Scope, word: str = "WHERE") -> tuple[str, list[Any]]:
    """The SQL that keeps the rows of *campaign* (``WHERE column = ?``, or ``IN (...)`` for several; ``AND ...``
    with *word*), and its parameters."""
    if not campaign:
        return "", []
    if isinstance(campaign, str):
        return f" {word} {column} = ?", [campaign]
    return f" {word} {column} IN ({', '.join('?' for _ in campaign)})", list(campaign)


def run_total(store: Store) -> int:
    return int(store.con.execute("SELECT count(*) FROM runs").fetchall()[0][0])


def campaign_rows(store: Store, campaign: Scope = None) -> list[dict[str, Any]]:
    """The campaigns rows in scope, each with what its runs spent (``spent_gpu_hours``, ``spent_allocation_hours``:
    devices x allocation seconds, the runs' ``elapsed_s``) and, over its ended runs submit predicted
    (``runs_predicted``), the GPU-hours predicted and spent (``predicted_gpu_hours``, ``predicted_runs_spent``)."""
    where, params = _scope("c.campaign", campaign)
    gpu, pred = device_seconds("r.elapsed_s"), device_seconds("r.predicted_seconds")
    return store.fetch_dicts(
        f"""WITH s AS (SELECT r.campaign, sum({gpu}) / 3600 AS spent_gpu_hours,
                              sum(r.elapsed_s) / 3600 AS spent_allocation_hours,
                              count(*) FILTER (WHERE r.predicted_seconds IS NOT NULL) AS runs_predicted,
                              sum({pred}) FILTER (WHERE r.predicted_seconds IS NOT NULL) / 3600
                                  AS predicted_gpu_hours,
                              sum({gpu}) FILTER (WHERE r.predicted_seconds IS NOT NULL) / 3600 AS predicted_runs_spent
                       FROM runs r LEFT JOIN points p USING (point_id)
                       WHERE r.elapsed_s > 0 GROUP BY r.campaign)
            SELECT c.*, s.* EXCLUDE (campaign) FROM campaigns c LEFT JOIN s USING (campaign){where}
            ORDER BY c.campaign""", params)


def campaign_list(store: Store) -> list[dict[str, Any]]:
    """Every campaign (a campaigns row or a run), oldest first: its name, ``created_at`` (the campaign
    row's, else its first attempt's submission) and how many ``runs`` it has; ties by name."""
    return store.fetch_dicts(
        """WITH names AS (SELECT campaign FROM campaigns UNION SELECT campaign FROM runs WHERE campaign IS NOT NULL),
                r AS (SELECT campaign, count(*) AS runs, min(submitted_at) AS first_submitted FROM runs GROUP BY 1)
           SELECT n.campaign, coalesce(c.created_at, r.first_submitted) AS created_at, coalesce(r.runs, 0) AS runs
           FROM names n LEFT JOIN campaigns c USING (campaign) LEFT JOIN r USING (campaign)
           ORDER BY created_at NULLS FIRST, n.campaign""")


def run_campaign(store: Store, run_id: str) -> str | None:
    """The campaign of run *run_id*, None if there is no such run."""
    rows = store.con.execute("SELECT campaign FROM runs WHERE run_id = ?", [run_id]).fetchall()
    return str(rows[0][0]) if rows and rows[0][0] is not None else None


def outcome_counts(store: Store, campaign: Scope = None) -> dict[str, int]:
    where, params = _scope("campaign", campaign)
    return {r["o"]: int(r["n"]) for r in store.fetch_dicts(
        f"SELECT coalesce(outcome, 'pending') AS o, count(*) AS n FROM runs{where} GROUP BY 1", params)}


def measurement_rows(store: Store, campaign: Scope = None) -> list[dict[str, Any]]:
    """Every measurements row, with its run's reason, in the report's order."""
    where, params = _scope("m.campaign", campaign)
    return store.fetch_dicts(
        f"""SELECT m.*, r.reason AS run_reason, r.stopped_by FROM measurements m JOIN runs r USING (run_id){where}
            ORDER BY m.model_name, m.experiment, m.number_gpus, m.batch_size, m.ended_at, m.run_id""", params)


def stability_rows(store: Store, campaign: Scope = None) -> dict[tuple[str, str], dict[str, Any]]:
    """``point_stability`` per (campaign, point_id), read over *campaign*'s measurements only."""
    where, params = _scope("campaign", campaign)
    rows = store.fetch_dicts(point_stability_sql(f"(SELECT * FROM measurements{where})"), params)
    return {(r["campaign"], r["point_id"]): r for r in rows}


def run_rows(store: Store, campaign: Scope = None) -> list[dict[str, Any]]:
    """Every run with its point's labels, in the stage chart's order."""
    where, params = _scope("r.campaign", campaign)
    return store.fetch_dicts(
        f"""SELECT r.run_id, r.campaign, r.point_id, r.repeat, r.attempt, r.experiment, r.outcome, r.reason,
                   r.elapsed_s, p.model_name, p.batch_size, p.number_gpus
            FROM runs r LEFT JOIN points p USING (point_id){where}
            ORDER BY p.model_name, r.experiment, p.number_gpus, p.batch_size, r.repeat, r.attempt, r.run_id""",
        params)


def stage_seconds(store: Store, campaign: Scope = None) -> list[dict[str, Any]]:
    """Per run and stage: the slowest host/rank, summed over trials. A stage that started and never
    ended (the run died in it) counts until that host's last sample and is marked unfinished (only those
    runs' samples are read)."""
    where, params = _scope("r.campaign", campaign)
    return store.fetch_dicts(
        f"""WITH st AS (SELECT s.* FROM stages s JOIN runs r USING (run_id){where}),
                 last AS (SELECT f.run_id, f.host, max(x.t_wall) AS t
                          FROM sample_rows x JOIN sample_files f USING (file_id)
                          WHERE f.run_id IN (SELECT run_id FROM st WHERE end_wall IS NULL) GROUP BY ALL),
                 per_trial AS (
                     SELECT s.run_id, s.stage, s.trial,
                            max(coalesce(s.duration_s, CASE WHEN s.end_wall IS NULL THEN l.t - s.start_wall END))
                                AS seconds,
                            bool_or(s.duration_s IS NULL) AS unfinished
                     FROM st s LEFT JOIN last l USING (run_id, host)
                     GROUP BY ALL)
            SELECT run_id, stage, sum(seconds) AS seconds, bool_or(unfinished) AS unfinished
            FROM per_trial GROUP BY ALL HAVING sum(seconds) IS NOT NULL""", params)


def attempt_rows(store: Store, campaign: Scope = None) -> list[dict[str, Any]]:
    """Every attempt with why it was sent (``submit_reason``), how it ended, its point's labels and what it
    measured (the report's repeats table), in point, repeat and attempt order."""
    where, params = _scope("r.campaign", campaign)
    return store.fetch_dicts(
        f"""SELECT r.run_id, r.campaign, r.point_id, r.repeat, r.attempt, r.submit_reason, r.state, r.outcome,
                   r.reason, r.stopped_by, r.elapsed_s, r.predicted_seconds, r.prediction_source,
                   p.model_name, p.batch_size, p.number_gpus, m.is_valid,
                   m.dataset_tokens_per_second, m.ci_rel_halfwidth, m.energy_joules, m.energy_source,
                   m.dataset_tokens_per_joule, m.host_busy, m.host_other_cpu_pct, m.shared_host, r.profiled,
                   m.straggler
            FROM runs r LEFT JOIN points p USING (point_id) LEFT JOIN measurements m USING (run_id){where}
            ORDER BY r.campaign, p.model_name, p.number_gpus, p.batch_size, r.point_id, r.repeat, r.attempt""",
        params)


def planned_repeats(store: Store, campaign: Scope = None) -> dict[tuple[str, str], int]:
    """How many repeats each (campaign, point) has: its ``campaign_points`` rows (a plain ``repeats: N`` lists
    them all; adaptive repeats list those submitted)."""
    where, params = _scope("campaign", campaign)
    return {(r[0], r[1]): int(r[2]) for r in store.con.execute(
        f"SELECT campaign, point_id, count(*) FROM campaign_points{where} GROUP BY 1, 2", params).fetchall()}


def gpu_sample_count(store: Store, campaign: Scope = None) -> int:
    """GPU sample rows (of *campaign*'s runs): the rows of those runs' sample files only."""
    where, params = _scope("r.campaign", campaign)
    return int(store.con.execute(
        "SELECT count(*) FROM sample_rows s WHERE s.kind = 'gpu' AND s.file_id IN ("
        f"SELECT f.file_id FROM sample_files f JOIN runs r USING (run_id){where})", params).fetchall()[0][0])


_UTILISATION_RUN = (
    "SELECT r.run_id, r.campaign, r.experiment, r.outcome, r.reason, r.elapsed_s, r.train_start_wall, "
    "r.train_end_wall, r.warmup_end_wall, r.sample_rows, p.model_name, p.batch_size, p.number_gpus, "
    "m.window_start_wall, m.window_end_wall "
    "FROM runs r LEFT JOIN points p USING (point_id) LEFT JOIN measurements m USING (run_id)")


def utilisation_run(store: Store, run_id: str | None = None, *, campaign: Scope = None,
                    pick: str = "longest_ok") -> dict[str, Any] | None:
    """One run for the utilisation panels: *run_id*; else the longest ok run (``longest_ok``) or the
    run with the most samples (``most_samples``), in *campaign* if given."""
    if run_id is not None:
        rows = store.fetch_dicts(f"{_UTILISATION_RUN} WHERE r.run_id = ?", [run_id])
    else:
        extra, params = _scope("r.campaign", campaign, "AND")
        if pick == "longest_ok":
            length = ("coalesce(r.elapsed_s, epoch(r.ended_at) - epoch(r.started_at), "
                      "r.train_end_wall - r.train_start_wall)")
            sql = f"{_UTILISATION_RUN} WHERE r.outcome = 'ok'{extra} ORDER BY {length} DESC NULLS LAST, r.run_id"
        else:
            sql = f"{_UTILISATION_RUN} WHERE r.sample_rows > 0{extra} ORDER BY r.sample_rows DESC, r.run_id"
        rows = store.fetch_dicts(sql + " LIMIT 1", params)
    return rows[0] if rows else None


def some_run_ids(store: Store, n: int) -> list[str]:
    return [r[0] for r in store.con.execute("SELECT run_id FROM runs ORDER BY run_id LIMIT ?", [n]).fetchall()]


def run_traces(store: Store, run_id: str, buckets: int) -> list[dict[str, Any]]:
    """A run's samples averaged into at most *buckets* time buckets per host, kind and device."""
    return store.fetch_dicts(
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


def preflight_rows(store: Store, last: int = 3) -> list[dict[str, Any]]:
    """The rows of the *last* sbench preflight runs, newest first, slowest device first within each."""
    return store.fetch_dicts(
        """SELECT * FROM preflight WHERE preflight_id IN (
               SELECT preflight_id FROM preflight GROUP BY preflight_id ORDER BY max(measured_at) DESC LIMIT ?)
           ORDER BY measured_at DESC, preflight_id DESC, figure, ratio, host, device""", [last])


def fabric_rows(store: Store, last: int = 20) -> list[dict[str, Any]]:
    """The rows of the *last* fabric runs that measured something, oldest run first."""
    return store.fetch_dicts(
        """SELECT * FROM fabric WHERE fabric_id IN (
               SELECT fabric_id FROM fabric WHERE bytes IS NOT NULL GROUP BY fabric_id
               ORDER BY max(measured_at) DESC LIMIT ?)
           ORDER BY fabric_id, op, bytes""", [last])


def overhead_rows(store: Store, campaign: Scope = None) -> list[dict[str, Any]]:
    """``run_overhead`` rows with the run's labels, most time outside training first (with *campaign*,
    computed from that campaign's stages only)."""
    where, params = _scope("r.campaign", campaign)
    stages = f"(SELECT s.* FROM stages s JOIN runs r USING (run_id){where})" if campaign else "stages"
    sql = f"""SELECT o.*, r.campaign, r.point_id, r.repeat, r.attempt, r.outcome, p.model_name, p.number_gpus,
                     p.batch_size
              FROM ({run_overhead_sql(stages)}) o JOIN runs r USING (run_id) LEFT JOIN points p USING (point_id)"""
    return store.fetch_dicts(sql + " ORDER BY o.outside_train_s DESC NULLS LAST, o.run_id, o.host", params)


def profile_runs(store: Store, campaign: Scope = None) -> list[dict[str, Any]]:
    """The profiled runs (of *campaign*) with their point's labels and files, and their ``profile_ops`` rows."""
    where, params = _scope("r.campaign", campaign, "AND")
    runs = store.fetch_dicts(
        f"""SELECT r.run_id, r.campaign, r.point_id, r.repeat, r.job_dir, r.profile_files, r.outcome,
                   p.model_name, p.number_gpus, p.batch_size, r.experiment
            FROM runs r LEFT JOIN points p USING (point_id) WHERE r.profiled{where}
            ORDER BY p.model_name, p.number_gpus, p.batch_size, r.run_id""", params)
    ops = store.fetch_dicts(
        f"""SELECT o.* FROM profile_ops o JOIN runs r USING (run_id) WHERE r.profiled{where}
            ORDER BY o.run_id, o.rank, o.kind, o.self_s DESC""", params)
    for r in runs:
        r["ops"] = [o for o in ops if o["run_id"] == r["run_id"]]
    return runs


def run_profile(store: Store, run_id: str) -> dict[str, Any]:
    """One run's profile (``sbench profile RUN``): the run, its files and its ``profile_ops`` rows; an input error
    names what is wrong (no such run; a run not profiled, or not collected since)."""
    runs = store.fetch_dicts("SELECT run_id, campaign, profiled, profile_files, outcome, job_dir FROM runs "
                             "WHERE run_id = ?", [run_id])
    if not runs:
        raise InputError(f"RUN {run_id!r}: no such run in {store.path}; profiled runs: sbench query \"SELECT run_id "
                         "FROM runs WHERE profiled\"")
    run = runs[0]
    if not run["profiled"]:
        raise InputError(f"RUN {run_id!r} was not profiled: submit with --profile (or runner.profile in the sweep); "
                         "its last repeat is profiled")
    run["ops"] = store.fetch_dicts("SELECT * FROM profile_ops WHERE run_id = ? ORDER BY rank, kind, self_s DESC",
                                   [run_id])
    return run


def compare_rows(store: Store, campaign: str | None, filters: Mapping[str, str]) -> list[dict[str, Any]]:
    """Valid measurements of ok runs selected by *campaign* and *filters* (a side of ``sbench compare``), by
    point_id, then as they ended.

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
    return store.fetch_dicts(f"SELECT m.* FROM measurements m JOIN runs r USING (run_id) WHERE {' AND '.join(where)} "
                             "ORDER BY m.point_id, m.ended_at, m.run_id", params)


def environment_of(store: Store, run_ids: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    """Each run's ``environment`` rows (one per host), with its ``job_dir``: what compare says changed."""
    ids = sorted(set(run_ids))
    if not ids:
        return {}
    out: dict[str, list[dict[str, Any]]] = {}
    for r in store.fetch_dicts(f"""SELECT e.*, r.job_dir FROM environment e JOIN runs r USING (run_id)
                                  WHERE e.run_id IN ({', '.join('?' for _ in ids)}) ORDER BY e.run_id, e.host""", ids):
        out.setdefault(r["run_id"], []).append(r)
    return out


def point_entities(store: Store, point_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Each point's recorded entity (a published point's: the fields its file gives) with its ``experiment``."""
    ids = sorted(set(point_ids))
    if not ids:
        return {}
    out = {}
    for pid, experiment, entity in store.con.execute(
            f"SELECT point_id, experiment, entity FROM points WHERE point_id IN ({', '.join('?' for _ in ids)})",
            ids).fetchall():
        doc = from_json(entity, {})
        out[str(pid)] = {**(doc if isinstance(doc, dict) else {}), "experiment": experiment}
    return out


def _across_where(n: int) -> str:
    return ("m.is_valid AND m.dataset_tokens_per_second IS NOT NULL AND NOT coalesce(m.shared_host, false) "
            f"AND NOT coalesce(m.host_busy, false) AND m.point_id IN ({', '.join('?' for _ in range(n))})")


def across_clusters(store: Store, point_ids: Sequence[str]) -> bool:
    """Whether the view across clusters has anything to show for *point_ids*: one of them measured (as
    :func:`across_campaigns` reads them) under two clusters or more, or any reference campaign in the store. One
    aggregate, so that a store of one cluster's nightly campaigns never loads every night's rows for nothing."""
    ids = sorted(set(point_ids))
    if not ids:
        return False
    row = store.con.execute(
        f"""SELECT EXISTS (SELECT 1 FROM campaigns WHERE origin = '{ORIGIN_ADO_CSV}')
                   OR EXISTS (SELECT m.point_id FROM measurements m LEFT JOIN campaigns c USING (campaign)
                              WHERE {_across_where(len(ids))} AND c.origin IS DISTINCT FROM '{ORIGIN_ADO_CSV}'
                              GROUP BY m.point_id HAVING count(DISTINCT coalesce(c.cluster, '?')) > 1)""",
        ids).fetchone()
    return bool(row and row[0])


def across_campaigns(store: Store, point_ids: Sequence[str]) -> list[dict[str, Any]]:
    """The valid measurements of *point_ids* in every campaign (the report's view across clusters), with each
    campaign's cluster and origin; runs on a shared or busy host left out."""
    ids = sorted(set(point_ids))
    if not ids:
        return []
    return store.fetch_dicts(
        f"""SELECT m.campaign, m.point_id, m.experiment, m.model_name, m.number_gpus, m.number_nodes, m.batch_size,
                   m.model_max_length, m.gpu_model, m.dataset_tokens_per_second, c.cluster, c.origin
            FROM measurements m LEFT JOIN campaigns c USING (campaign)
            WHERE {_across_where(len(ids))}
            ORDER BY m.gpu_model, c.cluster, m.campaign, m.point_id, m.run_id""", ids)


def published_measurements(store: Store) -> list[dict[str, Any]]:
    """Every valid measurement of the reference campaigns (``origin = 'ado-csv'``) with its point's recorded
    entity (``given``: the fields its file gives)."""
    rows = store.fetch_dicts(
        """SELECT m.campaign, m.point_id, m.experiment, m.gpu_model, m.dataset_tokens_per_second, p.entity,
                  c.cluster, c.origin
           FROM measurements m JOIN campaigns c USING (campaign) JOIN points p USING (point_id)
           WHERE c.origin = 'ado-csv' AND m.is_valid AND m.dataset_tokens_per_second IS NOT NULL
           ORDER BY m.campaign, m.point_id, m.run_id""")
    for r in rows:
        given = from_json(r.pop("entity"), {})
        r["given"] = {**(given if isinstance(given, dict) else {}), "experiment": r["experiment"]}
    return rows
