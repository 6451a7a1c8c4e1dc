"""What a prediction reads (``harness.spec.predict``): every ok run of the models and experiments a plan names,
with its allocation and training seconds, its MFU and its entity's columns; and for the FLOP model, each
partition's measured peak and each GPU model's start-up seconds."""

from __future__ import annotations

from collections.abc import Sequence

from harness.contract.paths import DbTarget
from harness.spec.plan import PlannedPoint
from harness.spec.predict import SHAPE_FIELDS, Fleet, Prediction, Seen, predict

from .schema import device_seconds
from .store import Store, open_store, store_exists

_FIELDS = ("model_name", "batch_size", "max_steps", *SHAPE_FIELDS)


def seen_runs(store: Store, models: Sequence[str]) -> list[Seen]:
    """Every ok run of *models* with a measurement, whatever its campaign (an imported one's too)."""
    if not models:
        return []
    marks = ", ".join("?" for _ in models)
    cols = ", ".join(f"m.{c}" for c in _FIELDS)
    rows = store.con.execute(
        f"SELECT r.point_id, r.experiment, r.elapsed_s, r.train_end_wall - r.train_start_wall, m.mfu, {cols} "
        "FROM runs r JOIN measurements m USING (run_id) WHERE r.outcome = 'ok' AND m.is_valid "
        f"AND r.elapsed_s > 0 AND m.model_name IN ({marks})", list(models)).fetchall()
    return [Seen(str(r[0]), str(r[1]), dict(zip(_FIELDS, r[5:], strict=True)), float(r[2]),
                 float(r[3]) if r[3] is not None and r[3] >= 0 else None,
                 float(r[4]) if r[4] is not None else None) for r in rows]


def fleet(store: Store, cluster: str | None = None) -> Fleet:
    """Each partition's measured peak per dtype (the median over its devices' latest ``measured_peaks``; of
    *cluster* where named), and each GPU model's start-up seconds over every ok run."""
    where, args = ("WHERE cluster = ?", [cluster]) if cluster else ("", [])
    peaks = {(str(p), str(d)): float(v) for p, d, v in store.con.execute(
        f"SELECT partition, dtype, median(peak_tflops) FROM measured_peaks {where} GROUP BY ALL "
        "HAVING median(peak_tflops) > 0", args).fetchall() if p is not None and d is not None}
    startups: dict[str, list[float]] = {}
    for gpu, start in store.con.execute(
            "SELECT coalesce(m.gpu_model, ''), r.elapsed_s - (r.train_end_wall - r.train_start_wall) "
            "FROM runs r JOIN measurements m USING (run_id) WHERE r.outcome = 'ok' AND r.elapsed_s > 0 "
            "AND r.train_end_wall >= r.train_start_wall").fetchall():
        if start is not None and start >= 0:
            startups.setdefault(str(gpu), []).append(float(start))
    return Fleet(peaks, startups)


def spent_hours(store: Store, campaign: str) -> tuple[float, float]:
    """(GPU-hours, allocation hours) *campaign*'s runs have held so far (their devices x allocation seconds)."""
    row = store.con.execute(
        f"SELECT coalesce(sum({device_seconds('r.elapsed_s')}), 0) / 3600, "
        "coalesce(sum(r.elapsed_s), 0) / 3600 FROM runs r LEFT JOIN points p USING (point_id) "
        "WHERE r.campaign = ? AND r.elapsed_s > 0", [campaign]).fetchone()
    return (float(row[0]), float(row[1])) if row else (0.0, 0.0)


def predictions(db: DbTarget, points: Sequence[PlannedPoint], campaign: str | None = None,
                cluster: str | None = None) -> tuple[list[Prediction], tuple[float, float]]:
    """Each valid point's prediction from *db* (the FLOP model's alone where the store is missing), and what
    *campaign* spent."""
    valid = [p for p in points if p.valid]
    seen: list[Seen] = []
    found, spent = Fleet({}, {}), (0.0, 0.0)
    if store_exists(db):
        with open_store(db, read_only=True) as st:
            seen = seen_runs(st, sorted({str(p.entity.get("model_name")) for p in valid}))
            found = fleet(st, cluster)
            spent = spent_hours(st, campaign) if campaign else (0.0, 0.0)
    return [predict(p.point_id, p.repeat, p.experiment, p.entity, seen, p.compute, found, p.partition)
            for p in valid], spent
