"""Where the tests' fixed inputs are: the checkout, the checked-in fixtures, the test SLURM cluster's inventory
and its start/stop script."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout: tests/kit/ is two below it
FIXTURES = ROOT / "tests" / "fixtures"
CLUSTER_SCRIPT = ROOT / "tests" / "cluster" / "cluster.sh"
TEST_INVENTORY = FIXTURES / "inventory" / "testcluster.yaml"  # the test cluster (cluster.sh) as an inventory
