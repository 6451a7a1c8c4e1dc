"""``python -m harness.runner.probe --out-dir DIR``: what this node really has (see ``sbench probe``).

:func:`probe_node` reads GPUs through NVML (model, count, memory, driver, CUDA), the RDMA devices from
``/sys/class/infiniband`` (ports, state, link layer, rate, and the GID table with each entry's type, so
which indices are RoCE v2 with an IPv4-mapped address), the memlock limit, cores and memory. It runs on
each node (one task per inventory host with ``--on slurm``) and writes ``DIR/probe.<node>.json``;
``harness.cluster.probe`` compares what it found with the inventory.
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from harness.contract.atomic import write_json
from harness.runner.envcapture import nvml_versions, read_hcas
from harness.spec.inventory import detect_gpus


def memlock() -> str:
    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return "unlimited" if soft == resource.RLIM_INFINITY else str(soft)


def reverse_dns_seconds(address: str = "::ffff:127.0.0.1") -> float:
    """Seconds one reverse lookup of an IPv4-mapped address takes here, with the node's own resolver
    settings (torch's TCPStore does one per peer; /etc/hosts never matches the mapped form, so it is
    DNS that answers, or times out)."""
    env = os.environ.pop("RES_OPTIONS", None)  # the node's configuration, not the job's override
    t0 = time.monotonic()
    try:
        socket.getnameinfo((address, 0, 0, 0), 0)
    except OSError:
        pass
    finally:
        if env is not None:
            os.environ["RES_OPTIONS"] = env
    return round(time.monotonic() - t0, 3)


def probe_node(host: str | None = None, sysfs_ib: Path | None = None) -> dict[str, Any]:
    gpus = detect_gpus()
    return {
        "host": host or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0],
        "t_wall": time.time(),
        "gpus": gpus, "gpu_count": len(gpus), **{"driver": None, "cuda_driver": None}, **nvml_versions(),
        "hcas": read_hcas(sysfs_ib),
        "memlock": memlock(),
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        # inventory GB as sbench requests it from SLURM: 1 GB = 1000 MB (MiB)
        "memory_gb": round(psutil.virtual_memory().total / 2**20 / 1000, 1),
        "reverse_dns_s": reverse_dns_seconds(),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.runner.probe",
                                 description="Probe this node (see sbench probe).")
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--host", default=None)
    args = ap.parse_args(argv)
    doc = probe_node(args.host)
    write_json(Path(args.out_dir) / f"probe.{doc['host']}.json", doc, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
