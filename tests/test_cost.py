"""A measurement's cost: the inventory's ``price_per_gpu_hour`` checked as every inventory number is, and
``cost_per_million_tokens`` from it (the trained campaigns' recomputation is in tests/test_flops.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.spec.cost import cost_per_million_tokens

from .kit import inventory as one_host_inventory
from .kit import write_yaml


def test_cost_per_million_tokens_pays_every_device_for_the_hour() -> None:
    # 8 devices at 2 an hour = 16 an hour; 10,000 tok/s = 36 M tok an hour: 16 / 36 per million
    assert cost_per_million_tokens(2.0, 8, 10_000.0) == pytest.approx(16 / 36, rel=1e-15)
    assert cost_per_million_tokens(2.0, 0, 3600.0) == pytest.approx(2.0 * 1e6 / 3600 / 3600)  # no GPU: one worker
    assert cost_per_million_tokens(None, 8, 10_000.0) is None
    assert cost_per_million_tokens(2.0, 8, None) is None and cost_per_million_tokens(2.0, 8, 0.0) is None


@pytest.mark.parametrize(("price", "said"), [(-1, ">= 0"), ("two", "must be a number"), (float("inf"), "finite")])
def test_a_bad_price_is_refused_naming_the_key(tmp_path: Path, cli, price, said: str) -> None:
    inv = one_host_inventory()
    part = next(iter(inv["partitions"].values()))
    part["price_per_gpu_hour"] = price
    path = write_yaml(tmp_path / "inv.yaml", inv)
    res = cli("inventory", "check", "-i", str(path))
    assert res.exit_code == 2 and "price_per_gpu_hour" in res.output and said in res.output, res.output
    assert "Traceback" not in res.output
