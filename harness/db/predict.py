"""What a prediction reads (``harness.spec.predict``): every ok run of the models and experiments a plan names,
with its allocation and training seconds and its entity's columns."""

from __future__ import annotations

from collections.abc import Sequence

from harness.contract.paths import DbTarget
from harness.spec.plan import PlannedPoint
from harness.spec.predict import SHAPE_FIELDS, Prediction, Seen, predict

from .store import Store, open_store, store_exists

_FIELDS = ("model_name", "batch_size", "max_steps", *SHAPE_FIELDS)


def seen_runs(store: Store, models: Sequence[str]) -> list[Seen]:
    """Every ok run of *models* with a measurement, whatever its campaign (an imported one's too)."""
    if not models:
        return []
    marks = ", ".join("?" for _ in models)
    cols = ", ".join(f"m.{c}" for c in _FIELDS)
    rows = store.con.execute(
        f"SELECT r.point_id, r.experiment, r.elapsed_s, r.train_end_wall - r.train_start_wall, {cols} "
        "FROM runs r JOIN measurements m USING (run_id) WHERE r.outcome = 'ok' AND m.is_valid "
        f"AND r.elapsed_s > 0 AND m.model_name IN ({marks})", list(models)).fetchall()
    return [Seen(str(r[0]), str(r[1]), dict(zip(_FIELDS, r[4:], strict=True)), float(r[2]),
                 float(r[3]) if r[3] is not None and r[3] >= 0 else None) for r in rows]


def spent_hours(store: Store, campaign: str) -> tuple[float, float]:
    """(GPU-hours, allocation hours) *campaign*'s runs have held so far (their devices x allocation seconds)."""
    row = store.con.execute(
        "SELECT coalesce(sum(r.elapsed_s * greatest(1, coalesce(p.number_gpus, 1))), 0) / 3600, "
        "coalesce(sum(r.elapsed_s), 0) / 3600 FROM runs r LEFT JOIN points p USING (point_id) "
        "WHERE r.campaign = ? AND r.elapsed_s > 0", [campaign]).fetchone()
    return (float(row[0]), float(row[1])) if row else (0.0, 0.0)


def predictions(db: DbTarget, points: Sequence[PlannedPoint], campaign: str | None = None
                ) -> tuple[list[Prediction], tuple[float, float]]:
    """Each valid point's prediction from *db* (none where the file is missing), and what *campaign* spent."""
    valid = [p for p in points if p.valid]
    if not store_exists(db):
        return [predict(p.point_id, p.repeat, p.experiment, p.entity, []) for p in valid], (0.0, 0.0)
    with open_store(db, read_only=True) as st:
        seen = seen_runs(st, sorted({str(p.entity.get("model_name")) for p in valid}))
        spent = spent_hours(st, campaign) if campaign else (0.0, 0.0)
    return [predict(p.point_id, p.repeat, p.experiment, p.entity, seen) for p in valid], spent
