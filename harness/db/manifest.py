"""What ``submit`` records: the campaign manifest's lines (``harness.contract.records``) as rows, idempotently.

``record_manifest(store, events)``: ``campaign`` -> ``campaigns``, ``point`` -> ``points`` and
``campaign_points``, ``attempt`` -> ``runs`` (with submit's prediction of it; a new row starts in
``jobstate.INITIAL`` with ``outcome`` NULL; an existing row keeps the state/outcome collect found, only its
submission columns are refreshed),
``references`` -> the campaign's ``references_spec``, ``repeats`` -> its ``repeats_spec``, ``budget`` -> its
``budget_spec``, ``cancel`` ->
``runs.cancel_requested_at``, ``search`` -> ``search_decisions`` (the newest per point). One
transaction; returns the problems found in malformed events (``strict=True`` raises :class:`CollectError`
on the first instead). Collect records them too, from the manifests it finds, and adds the job dirs that
were submitted by hand (``ensure_spec_rows``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from harness.contract import jobstate
from harness.contract.errors import CollectError, RecordError
from harness.contract.paths import run_id
from harness.contract.records import check_line, prediction_columns

from .schema import MANIFEST_RUN_COLUMNS, PRIMARY_KEYS, SCHEMA, q
from .staging import frame
from .store import Store
from .values import entity_values, key_int, to_json, to_str, utc


def point_row(point_id: str, experiment: Any, entity: Any, valid: Any, reasons: Any, notes: Any) -> dict[str, Any]:
    ent = entity if isinstance(entity, Mapping) else {}
    row: dict[str, Any] = {"point_id": point_id, "experiment": experiment,
                           "valid": None if valid is None else bool(valid),
                           "reasons": [str(r) for r in reasons] if isinstance(reasons, list) else None,
                           "notes": [str(n) for n in notes] if isinstance(notes, list) else None,
                           "entity": to_json(dict(ent)) if ent else None}
    row.update(entity_values(ent))
    return row


def attempt_row(ev: Mapping[str, Any]) -> dict[str, Any]:
    campaign, pid = to_str(ev["campaign"]), to_str(ev["point_id"])
    repeat, attempt = key_int(ev.get("repeat") or 0, "repeat"), key_int(ev["attempt"], "attempt")
    task = ev.get("array_task_id")
    task = None if task is None else key_int(task, "array_task_id")
    return {"run_id": run_id(campaign, pid, repeat, attempt), "campaign": campaign, "point_id": pid,
            "repeat": repeat, "attempt": attempt, "experiment": ev.get("experiment"),
            "job_dir": None if ev.get("job_dir") is None else str(ev["job_dir"]),
            "executor": ev.get("executor"), "job_id": None if ev.get("job_id") is None else str(ev["job_id"]),
            "array_job_id": None if ev.get("array_job_id") is None else str(ev["array_job_id"]),
            "array_task_id": task, "submit_reason": ev.get("reason"),
            "submitted_at": utc(ev.get("submitted_at")), **prediction_columns(ev)}


# -- manifest (submit's API) ---------------------------------------------------------------------------
def record_manifest(store: Store, events: Iterable[Mapping[str, Any]], *, strict: bool = True,
                    source: str = "manifest") -> list[str]:
    """Idempotently record manifest events (see the module docstring)."""
    campaigns: list[dict[str, Any]] = []
    points: list[dict[str, Any]] = []
    links: list[dict[str, Any]] = []
    attempts: list[dict[str, Any]] = []
    cancels: list[tuple[str, list[str], Any]] = []
    references: dict[str, list[Any]] = {}  # campaign -> the newest references line's
    repeats: dict[str, Any] = {}  # campaign -> the newest repeats: {min, max, cv} (None: a plain repeats: N)
    budgets: dict[str, Any] = {}  # campaign -> the newest budget: {gpu_hours, allocation_hours} (None: none)
    decisions: list[dict[str, Any]] = []
    problems: list[str] = []

    def bad(i: int, msg: str) -> None:
        text = f"{source} event {i}: {msg}"
        if strict:
            raise CollectError(text)
        problems.append(text)

    for i, raw in enumerate(events, 1):
        try:
            ev: Mapping[str, Any] = check_line(raw)
        except RecordError as exc:
            bad(i, str(exc))
            continue
        kind = ev["type"]
        try:
            if kind == "campaign":
                campaigns.append({"campaign": str(ev["campaign"]), "experiment": ev.get("experiment"),
                                  "sweep": ev.get("sweep"), "inventory": ev.get("inventory"),
                                  "partition": ev.get("partition"), "executor": ev.get("executor"),
                                  "created_at": utc(ev.get("created_at")),
                                  "sbench_version": ev.get("sbench_version"), "source": "manifest",
                                  "references_spec": to_json(ev.get("references") or []),
                                  "repeats_spec": to_json(ev.get("repeats")) if ev.get("repeats") else None,
                                  "cluster": None if ev.get("cluster") is None else str(ev["cluster"]),
                                  "partitions": to_json(ev["partitions"]) if isinstance(ev.get("partitions"), dict)
                                  else None,
                                  "search_spec": to_json(ev.get("search")) if ev.get("search") else None,
                                  "budget_spec": to_json(ev["budget"]) if isinstance(ev.get("budget"), dict)
                                  else None})
                references[str(ev["campaign"])] = ev.get("references") or []
                repeats[str(ev["campaign"])] = ev.get("repeats")
                budgets[str(ev["campaign"])] = ev.get("budget")
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
            elif kind == "repeats":
                repeats[str(ev["campaign"])] = ev.get("repeats")  # repeats: changed: the newest word
            elif kind == "budget":
                budgets[str(ev["campaign"])] = ev.get("budget")  # budget: changed: the newest word
            elif kind == "search":
                rep = ev.get("repeat")
                decisions.append({"campaign": str(ev["campaign"]), "point_id": str(ev["point_id"]),
                                  "phase": ev.get("phase"), "action": ev.get("action"), "reason": ev.get("reason"),
                                  "repeat": None if rep is None else key_int(rep, "repeat"),
                                  "decided_at": utc(ev.get("at"))})
            else:  # cancel
                # SLURM attempts are named by job id, local ones (no job id when queued) by job dir.
                ids, dirs = ev.get("job_ids") or [], ev.get("job_dirs") or []
                if not isinstance(ids, list) or not isinstance(dirs, list):
                    raise TypeError("job_ids and job_dirs must be lists")
                cancels.append((str(ev["campaign"]), [str(j) for j in ids + dirs], utc(ev.get("at"))))
        except (KeyError, TypeError, ValueError) as exc:
            bad(i, f"{kind} line is malformed: {exc!r}")
    with store.transaction():
        store.upsert("campaigns", campaigns, [c for c, _ in SCHEMA["campaigns"]])
        for camp, refs in references.items():
            store.con.execute("UPDATE campaigns SET references_spec = ?::JSON WHERE campaign = ? AND "
                             "references_spec IS DISTINCT FROM ?::JSON", [to_json(refs), camp, to_json(refs)])
        for camp, rep in repeats.items():
            value = to_json(rep) if rep else None
            store.con.execute("UPDATE campaigns SET repeats_spec = ?::JSON WHERE campaign = ? AND "
                             "repeats_spec IS DISTINCT FROM ?::JSON", [value, camp, value])
        for camp, spec in budgets.items():
            value = to_json(spec) if isinstance(spec, dict) else None
            store.con.execute("UPDATE campaigns SET budget_spec = ?::JSON WHERE campaign = ? AND "
                             "budget_spec IS DISTINCT FROM ?::JSON", [value, camp, value])
        store.upsert("points", points, [c for c, _ in SCHEMA["points"]])
        store.upsert("campaign_points", links, [])
        store.upsert("search_decisions", decisions, [c for c, _ in SCHEMA["search_decisions"]])
        store.upsert("runs", attempts, MANIFEST_RUN_COLUMNS, keep_when_null=True)
        new = [a["run_id"] for a in attempts]
        if new:
            store.con.register("_sbench_new", frame([("run_id", "VARCHAR")], [{"run_id": r} for r in new]))
            try:
                store.con.execute("UPDATE runs SET state = ? WHERE state IS NULL AND outcome IS NULL "
                                 "AND run_id IN (SELECT run_id FROM _sbench_new)", [jobstate.INITIAL])
            finally:
                store.con.unregister("_sbench_new")
        for campaign, ids, at in cancels:
            for job_id in ids:
                store.con.execute("UPDATE runs SET cancel_requested_at = ? WHERE campaign = ? "
                                 "AND (job_id = ? OR job_dir = ?) AND cancel_requested_at IS DISTINCT FROM ?",
                                 [at, campaign, job_id, job_id, at])
    return problems


def ensure_spec_rows(store: Store, campaign: Mapping[str, Any], point: Mapping[str, Any],
                     link: Mapping[str, Any], run: Mapping[str, Any]) -> None:
    """Rows for a job dir rendered and submitted by hand (no manifest): insert what is missing,
    never overwrite what a manifest recorded."""
    with store.transaction():
        for table, row in (("campaigns", campaign), ("points", point), ("campaign_points", link),
                           ("runs", run)):
            key = PRIMARY_KEYS[table]
            where = " AND ".join(f"{q(k)} = ?" for k in key)
            if store.con.execute(f"SELECT 1 FROM {q(table)} WHERE {where}", [row[k] for k in key]).fetchall():
                continue
            store.insert(table, [row])
