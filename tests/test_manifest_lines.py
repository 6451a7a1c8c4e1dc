"""The manifest's point line and the planned point it records are one set of fields."""

from __future__ import annotations

import dataclasses
import typing

from harness.contract.records import PointFields, PointLine
from harness.spec.plan import PlannedPoint


def test_a_point_line_has_the_planned_points_fields_and_no_others() -> None:
    planned = {f.name for f in dataclasses.fields(PlannedPoint) if f.metadata.get("recorded", True)} | {
        "predicted_oom"}  # predicted_oom: a property
    assert set(typing.get_type_hints(PointFields)) == planned
    assert set(typing.get_type_hints(PointLine)) == planned | {"type", "campaign"}
