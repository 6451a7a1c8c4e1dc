"""``SBENCH_FAULT`` checked before anything runs: ``plan`` and ``submit`` read the value the jobs will get (this
command's environment, which the local executor and SLURM's ``--export`` pass on, and every ``env:`` map of the
inventory that reaches the sweep's partition) and refuse a malformed one with exit 2, naming where it came
from. Inside a job the same parser (:func:`harness.runner.faults.parse_faults`) would fail it, or, before the
checks it runs now, do nothing at all."""

from __future__ import annotations

import os
from collections.abc import Collection, Iterator

from harness.contract import envvars
from harness.contract.errors import InputError
from harness.runner.faults import FaultSpecError, check
from harness.spec.inventory import Inventory


def fault_sources(inv: Inventory, partitions: Collection[str] | None) -> Iterator[tuple[str, str]]:
    """``(where, value)`` of every ``SBENCH_FAULT`` the jobs on *partitions* (every partition: None) may get."""
    name = envvars.FAULT.name
    if os.environ.get(name):
        yield f"{name} (this command's environment, which the jobs inherit)", os.environ[name]
    if name in inv.env:
        yield f"{inv.source}: defaults.env.{name}", inv.env[name]
    for pname, part in inv.partitions.items():
        if partitions is not None and pname not in partitions:
            continue
        if name in part.env:
            yield f"{inv.source}: partitions.{pname}.env.{name}", part.env[name]
        for hname, host in part.hosts.items():
            if name in host.env:
                yield f"{inv.source}: partitions.{pname}.hosts.{hname}.env.{name}", host.env[name]


def check_faults(inv: Inventory, partitions: Collection[str] | None = None) -> None:
    """Raise :class:`InputError` (exit 2) for the first malformed ``SBENCH_FAULT`` the jobs would get."""
    for where, value in fault_sources(inv, partitions):
        try:
            check(value, where)
        except FaultSpecError as exc:
            raise InputError(str(exc)) from None
