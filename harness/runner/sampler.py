"""One sampler per node: GPU and process-tree readings into ``samples.<host>.csv``.

GPU readings come from a backend picked by name from :data:`BACKENDS`:

- ``nvml``: the real NVIDIA Management Library (``pynvml`` from nvidia-ml-py). Used whenever
  NVML loads; on a machine without the NVIDIA driver there are simply no GPU rows.
- ``fake``: a deterministic stand-in for NVML, for tests: ``SBENCH_SAMPLER_BACKEND=fake`` and
  ``SBENCH_FAKE_GPUS=N``. It goes through the same device matching as ``nvml``.
- ``none``: no GPU rows.

The GPUs sampled are those the job uses: ``CUDA_VISIBLE_DEVICES`` in its own order (CUDA
indices or ``GPU-<uuid>`` prefixes, as CUDA accepts them), matched to NVML devices by UUID, or
for indices by PCI bus id order (CUDA's order with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, and its
tie-break among identical GPUs otherwise), then the first ``max_devices`` of them (one per
process on the node). Row ``device`` is the position in that order.

The process row covers the training process tree (the command the node runner started and all
its descendants, found again on every tick). CPU % is computed from ``cpu_times`` deltas
(100 = one core), the same formula as ``psutil.Process.cpu_percent``; a process seen for the
first time is primed and not counted unless it was born after the previous tick (then its whole
CPU time falls inside the interval). The first tick only primes, so no invented 0.0 is written.

Energy: each GPU row's ``energy_j`` is the joules the GPU used since the sampler's first reading of it,
from NVML's total-energy counter (``nvmlDeviceGetTotalEnergyConsumption``, millijoules since the driver
loaded, Volta and later). On CPU partitions the node runner adds a :class:`RaplReader`: one ``cpu`` row
per CPU package per tick, ``energy_j`` from RAPL's ``energy_uj`` under the powercap root
(``SBENCH_POWERCAP``). :class:`EnergyCounter` turns a counter into that running total: a value lower
than the one before is a wrap-around where the counter has a range (RAPL's ``max_energy_range_uj``),
else a reset (the driver reloaded), counted from zero, so the total never goes back. A device without
a counter (NVML's NotSupported before Volta, RAPL unreadable by this user) leaves ``energy_j`` empty.
Collect reads the total at the measured window's edges (docs/job-directory.md); so that the end is
covered, :meth:`Sampler.stop` takes a last reading of the counters.
"""

from __future__ import annotations

import csv
import os
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from harness.contract import envvars
from harness.contract.defaults import sample_interval
from harness.contract.formats import SAMPLE_CSV_NAMES


@dataclass(frozen=True)
class GpuDevice:
    index: int  # position in the job's CUDA_VISIBLE_DEVICES order (the samples' ``device``)
    nvml_index: int
    uuid: str
    pci_bus_id: str
    name: str
    memory_total_mb: float | None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


# -- CUDA_VISIBLE_DEVICES -----------------------------------------------------------------------

def parse_visible_devices(value: str | None) -> list[str] | None:
    """The entries of ``CUDA_VISIBLE_DEVICES``; None when unset (all devices visible).

    Like CUDA, parsing stops at the first entry that is neither an index nor a UUID.
    """
    if value is None:
        return None
    out: list[str] = []
    for raw in value.split(","):
        tok = raw.strip()
        if tok.isdigit() or tok.startswith(("GPU-", "MIG-")):
            out.append(tok)
        else:
            break  # includes "-1" and "": no (further) devices
    return out


def match_visible(all_devices: list[dict[str, Any]], visible: list[str] | None) -> list[dict[str, Any]]:
    """NVML devices (dicts with ``nvml_index``, ``uuid``, ``pci_bus_id``) in CUDA_VISIBLE_DEVICES order."""
    by_pci = sorted(all_devices, key=lambda d: str(d["pci_bus_id"]).lower())
    if visible is None:
        return by_pci
    out: list[dict[str, Any]] = []
    for tok in visible:
        found = None
        if tok.isdigit():
            i = int(tok)
            found = by_pci[i] if i < len(by_pci) else None
        elif tok.startswith("GPU-"):
            hits = [d for d in all_devices if str(d["uuid"]).lower().startswith(tok.lower())]
            found = hits[0] if len(hits) == 1 else None  # CUDA rejects an ambiguous prefix
        # MIG instances are not NVML devices of their own here: they are skipped.
        if found is None:
            break  # CUDA ignores this entry and every one after it
        if found not in out:
            out.append(found)
    return out


# -- energy counters ----------------------------------------------------------------------------

class EnergyCounter:
    """The energy one device used since its first reading, from a counter read in integer units.

    *per_joule*: units per joule (NVML's millijoules: 1000, RAPL's microjoules: 1000000); *wrap*: where the
    counter wraps (RAPL's ``max_energy_range_uj``), None when it only resets. The running total is kept in
    units, so the joules written are exact.
    """

    def __init__(self, per_joule: int, wrap: int | None = None) -> None:
        self.per_joule, self.wrap = per_joule, wrap
        self.prev: int | None = None
        self.units = 0
        self.resets = 0
        self.wraps = 0

    def update(self, raw: Any) -> float | None:
        """The total after reading *raw* (None or not a number: no reading now, the total is not written)."""
        if raw is None or isinstance(raw, bool):
            return None
        try:
            value = int(raw)
        except (TypeError, ValueError):
            return None
        if self.prev is not None:
            if value >= self.prev:
                self.units += value - self.prev
            elif self.wrap:
                self.units += value + self.wrap - self.prev  # wrapped past its range once
                self.wraps += 1
            else:
                self.units += value  # reset: what it counted since the reset
                self.resets += 1
        self.prev = value
        return self.units / self.per_joule


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


class RaplReader:
    """The CPU packages' RAPL energy counters under a powercap root (``<root>/intel-rapl:<n>``, the
    top-level zones whose ``name`` starts with ``package``; their subzones, core and dram, are inside the
    package's figure, and a ``psys`` zone would count the packages twice). Only zones whose ``energy_uj``
    this user can read (root only on recent kernels)."""

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(envvars.POWERCAP.get() if root is None else root)
        self.zones: list[tuple[int, Path, EnergyCounter]] = []
        self.unreadable: list[str] = []
        try:
            found = sorted(self.root.glob("intel-rapl:*"), key=lambda d: d.name)
        except OSError:
            found = []
        for d in found:
            m = re.fullmatch(r"intel-rapl:(\d+)", d.name)
            if not m:
                continue
            try:
                name = (d / "name").read_text().strip()
            except OSError:
                continue
            if not name.startswith("package"):
                continue
            if _read_int(d / "energy_uj") is None:
                self.unreadable.append(d.name)
                continue
            wrap = _read_int(d / "max_energy_range_uj")
            self.zones.append((int(m.group(1)), d / "energy_uj", EnergyCounter(1_000_000, wrap)))
        self.zones.sort(key=lambda z: z[0])

    def read(self) -> list[tuple[int, float | None]]:
        """(package number, joules since the first reading) of every readable package."""
        return [(idx, counter.update(_read_int(path))) for idx, path, counter in self.zones]

    def note(self) -> str | None:
        """Why there is no RAPL figure, or None when there is one."""
        if self.zones:
            return None
        if self.unreadable:
            return f"RAPL energy unreadable under {self.root} ({', '.join(self.unreadable)}): no energy rows"
        return f"no RAPL package zone under {self.root}: no energy rows"


# -- backends -----------------------------------------------------------------------------------

class GpuBackend:
    """No GPUs. Subclasses return the devices in use and one reading per device."""

    name = "none"

    def devices(self) -> list[GpuDevice]:
        return []

    def read(self, own: set[int] | None = None) -> list[dict[str, float | None]]:
        return []

    def close(self) -> None:
        pass


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class NvmlBackend(GpuBackend):
    """Readings through an NVML module (``pynvml`` or :class:`FakeNvml`)."""

    name = "nvml"

    def __init__(self, nvml: Any = None, *, max_devices: int | None = None,
                 visible: str | None = None, use_env: bool = True) -> None:
        if nvml is None:
            import pynvml  # optional: only needed here

            nvml = pynvml
        self.nvml = nvml
        nvml.nvmlInit()  # raises when the library or driver is missing
        all_devs = []
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            try:
                mem_total = nvml.nvmlDeviceGetMemoryInfo(h).total / 2**20
            except Exception:  # noqa: BLE001 - NotSupported on some devices
                mem_total = None
            all_devs.append({"nvml_index": i, "handle": h, "uuid": _s(nvml.nvmlDeviceGetUUID(h)),
                             "pci_bus_id": _s(nvml.nvmlDeviceGetPciInfo(h).busId),
                             "name": _s(nvml.nvmlDeviceGetName(h)), "memory_total_mb": mem_total})
        if use_env and visible is None:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        chosen = match_visible(all_devs, parse_visible_devices(visible))
        self._all = [GpuDevice(index=k, **{x: d[x] for x in ("nvml_index", "uuid", "pci_bus_id", "name",
                                                              "memory_total_mb")})
                     for k, d in enumerate(chosen)]
        self._handles = [d["handle"] for d in chosen]
        self._energy = [EnergyCounter(1000) for _ in chosen]  # NVML counts millijoules; it resets, never wraps
        self.max_devices = max_devices

    def visible_devices(self) -> list[GpuDevice]:
        return list(self._all)

    def devices(self) -> list[GpuDevice]:
        n = len(self._all) if self.max_devices is None else min(self.max_devices, len(self._all))
        return self._all[:n]

    def _field(self, fn: Callable[[Any], Any], handle: Any) -> Any:
        try:
            return fn(handle)
        except Exception:  # noqa: BLE001 - a field NVML cannot report is left empty
            return None

    def read(self, own: set[int] | None = None) -> list[dict[str, float | None]]:
        """One reading per device in use; *own*: the run's processes (its tree and the node runner), so that
        each row counts the processes on that GPU that are not the run's (``foreign_procs``)."""
        nv = self.nvml
        out = []
        foreign = self._foreign(own or set())
        for dev in self.devices():
            h = self._handles[dev.index]
            util = self._field(nv.nvmlDeviceGetUtilizationRates, h)
            mem = self._field(nv.nvmlDeviceGetMemoryInfo, h)
            power = self._field(nv.nvmlDeviceGetPowerUsage, h)
            limit = self._field(nv.nvmlDeviceGetEnforcedPowerLimit, h)
            energy = self._energy[dev.index].update(self._field(nv.nvmlDeviceGetTotalEnergyConsumption, h))
            out.append({
                "gpu_util": None if util is None else util.gpu,
                "mem_used_mb": None if mem is None else mem.used / 2**20,
                "mem_total_mb": None if mem is None else mem.total / 2**20,
                "power_w": None if power is None else power / 1000.0,  # NVML reports milliwatts
                "power_limit_w": None if limit is None else limit / 1000.0,
                "energy_j": energy,
                "foreign_procs": foreign.get(dev.index),
            })
        return out

    def _pids(self, handle: Any) -> set[int] | None:
        """The pids NVML lists on a device (compute and graphics); None where it cannot say."""
        found: set[int] = set()
        answered = False
        for fn in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            if not hasattr(self.nvml, fn):
                continue
            procs = self._field(getattr(self.nvml, fn), handle)
            if procs is not None:
                answered = True
                found |= {int(p.pid) for p in procs}
        return found if answered else None

    def _foreign(self, own: set[int]) -> dict[int, int | None]:
        """Per device in use: the processes on it that are not in *own*. Unknown (None) on every device when the
        run's processes are known but NVML lists none of them on any device while it lists others: its pids
        are then another PID namespace's (a container's), and nobody can tell whose they are."""
        pids = {dev.index: self._pids(self._handles[dev.index]) for dev in self.devices()}
        listed: set[int] = set().union(*(p for p in pids.values() if p))
        if len(own) > 1 and listed and not (listed & own):
            return {i: None for i in pids}
        return {i: None if p is None else len(p - own) for i, p in pids.items()}

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


class FakeNvmlNotSupported(Exception):
    """What the fake raises for a field the device lacks (pynvml: ``NVMLError_NotSupported``)."""


class FakeNvml:
    """A deterministic NVML: ``n`` GPUs whose readings depend only on (GPU, call number).

    GPU ``i`` has UUID ``GPU-fa4e0000-0000-0000-0000-00000000000i``, PCI bus id
    ``00000000:<0x10+i>:00.0``, 80 GiB, memory used ``1024*(i+1)`` MiB, power ``100+10*i`` W of a
    ``400+i`` W limit, and utilisation ``(10*i + 5*call) % 101``. Its energy counter reads
    ``1_000_000*(i+1) + (100+10*i)*1000*k`` mJ on its k-th call (as if one second of its power passed between
    calls); a GPU in *reset_after* (GPU -> k) starts counting again from 0 mJ after its k-th call, and one in
    *no_energy* has no counter (NotSupported, as before Volta). *processes* (GPU -> pids) are the compute
    processes NVML lists on each GPU.
    """

    class _Obj:
        def __init__(self, **kw: Any) -> None:
            self.__dict__.update(kw)

    def __init__(self, n: int, *, no_energy: Iterable[int] = (), reset_after: dict[int, int] | None = None,
                 processes: dict[int, list[int]] | None = None) -> None:
        self.n = n
        self.processes = dict(processes or {})  # GPU -> the pids running on it (none by default)
        self.calls = [0] * n
        self.energy_calls = [0] * n
        self.no_energy = set(no_energy)
        self.reset_after = dict(reset_after or {})
        self.initialised = False

    @staticmethod
    def uuid(i: int) -> str:
        return f"GPU-fa4e0000-0000-0000-0000-{i:012d}"

    def nvmlInit(self) -> None:
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False

    def nvmlDeviceGetCount(self) -> int:
        return self.n

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        if not 0 <= i < self.n:
            raise ValueError(f"no fake GPU {i}")
        return i

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return self.uuid(h)

    def nvmlDeviceGetName(self, h: int) -> str:
        return "Fake GPU 80GB"

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        return self._Obj(busId=f"00000000:{0x10 + h:02X}:00.0")

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return self._Obj(total=80 * 2**30, used=1024 * (h + 1) * 2**20, free=(80 * 1024 - 1024 * (h + 1)) * 2**20)

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        self.calls[h] += 1
        return self._Obj(gpu=(10 * h + 5 * self.calls[h]) % 101, memory=0)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return (100 + 10 * h) * 1000

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        return (400 + h) * 1000

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        return [self._Obj(pid=pid, usedGpuMemory=0) for pid in self.processes.get(h, [])]

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:
        if h in self.no_energy:
            raise FakeNvmlNotSupported("Not Supported")
        self.energy_calls[h] += 1
        k = self.energy_calls[h]
        per_call = (100 + 10 * h) * 1000
        reset = self.reset_after.get(h)
        if reset is not None and k > reset:
            return per_call * (k - reset)  # the driver reloaded: counting again from 0
        return 1_000_000 * (h + 1) + per_call * k


def _nvml(max_devices: int | None = None) -> GpuBackend:
    return NvmlBackend(max_devices=max_devices)


def _fake(max_devices: int | None = None) -> GpuBackend:
    backend = NvmlBackend(FakeNvml(int(envvars.FAKE_GPUS.get())), max_devices=max_devices)
    backend.name = "fake"
    return backend


def _none(max_devices: int | None = None) -> GpuBackend:
    return GpuBackend()


BACKENDS: dict[str, Callable[..., GpuBackend]] = {"nvml": _nvml, "fake": _fake, "none": _none}


def open_backend(name: str | None = None, *, max_devices: int | None = None) -> tuple[GpuBackend, str | None]:
    """``(backend, note)``: *name*, else ``$SBENCH_SAMPLER_BACKEND``, else ``nvml`` falling back to none."""
    name = name or envvars.SAMPLER_BACKEND.get()
    if name not in BACKENDS:
        raise ValueError(f"unknown sampler backend {name!r}; known: {', '.join(BACKENDS)}")
    try:
        return BACKENDS[name](max_devices=max_devices), None
    except Exception as exc:  # NVML missing is normal on CPU nodes
        if name == "nvml":
            return GpuBackend(), f"NVML not available ({type(exc).__name__}: {exc}); no GPU rows"
        raise


# -- the process tree ---------------------------------------------------------------------------

class ProcessTree:
    """CPU and memory of a process and all its descendants, found anew on each reading."""

    def __init__(self, root_pid: int) -> None:
        self.root_pid = root_pid
        self._root: psutil.Process | None = None
        self._prev: dict[tuple[int, float], float] = {}
        self._last_wall: float | None = None
        self._last_mono: float | None = None
        self._mem_total = psutil.virtual_memory().total
        # For the reading at the tree's end (:meth:`final`): the CPU seconds of this process's reaped children
        # before the tree's root is reaped, and each tree process's CPU seconds when last seen.
        self._children_before = _children_cpu_s()
        self._seen: dict[tuple[int, float], float] = {}
        self.pids: set[int] = set()  # the tree's processes at the last reading
        self.last_cpu_s: float | None = None  # the CPU seconds the last reading counted (None: it counted none)

    def _procs(self) -> list[psutil.Process]:
        try:
            if self._root is None:
                self._root = psutil.Process(self.root_pid)
            if not self._root.is_running():
                return []
            return [self._root, *self._root.children(recursive=True)]
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return []

    def read(self) -> dict[str, float] | None:
        """One reading, or None when nothing can be reported yet (first call, or no process)."""
        now_wall, now_mono = time.time(), time.monotonic()
        cpu = rss = 0.0
        nprocs = counted = 0
        current: dict[tuple[int, float], float] = {}
        for p in self._procs():
            try:
                with p.oneshot():
                    key = (p.pid, p.create_time())
                    t = p.cpu_times()
                    total = t.user + t.system
                    mem = p.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            nprocs += 1
            rss += mem
            current[key] = total
            self._seen[key] = total
            if key in self._prev:
                cpu += max(0.0, total - self._prev[key])
                counted += 1
            elif self._last_wall is not None and key[1] >= self._last_wall:
                cpu += total  # born since the previous tick: all of its CPU time is in this interval
                counted += 1
        last_mono = self._last_mono
        self._prev, self._last_wall, self._last_mono = current, now_wall, now_mono
        self.pids = {pid for pid, _ in current}
        self.last_cpu_s = cpu if last_mono is not None and counted else None
        if last_mono is None or counted == 0 or now_mono <= last_mono:
            return None  # priming only: there is no interval to divide by
        return {
            "cpu_pct": 100.0 * cpu / (now_mono - last_mono),
            "mem_pct": 100.0 * rss / self._mem_total,
            "rss_mb": rss / 2**20,
            "nprocs": nprocs,
        }

    def final(self) -> dict[str, float] | None:
        """The reading at the tree's end, once its root has exited and been reaped by this process (the node
        runner): the CPU seconds its processes used since they were last seen, from this process's reaped
        children's total (``RUSAGE_CHILDREN``: the root's, which holds its reaped descendants'), over the time
        since the last reading. So the window's last moments before the training process ended have a CPU
        figure; what a process used between the last reading and an earlier exit lands here too (exact in
        sum); ``cpu_s``: those CPU seconds. None when nothing was read before, or the root is not reaped yet (a
        normal reading then)."""
        now_mono = time.monotonic()
        if self._last_mono is None or now_mono <= self._last_mono:
            return None
        try:
            if self._root is not None and self._root.is_running() and self._root.status() != psutil.STATUS_ZOMBIE:
                return None
        except psutil.Error:
            pass
        left = _children_cpu_s() - self._children_before - sum(self._seen.values())
        if left < 0:  # a child of this process other than the tree was reaped meanwhile: nothing can be said
            return None
        return {"cpu_pct": 100.0 * left / (now_mono - self._last_mono), "nprocs": 0, "cpu_s": left}


def _children_cpu_s() -> float:
    """The CPU seconds of this process's children that ended and were reaped (and of their reaped descendants)."""
    import resource  # POSIX only: where a job runs

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


# -- the host's other load --------------------------------------------------------------------------------

def _proc_stat() -> tuple[float, float] | None:
    """(busy, all) CPU seconds of the whole host since boot, from the ``cpu`` line of ``/proc/stat``
    (``SBENCH_PROC_STAT``): busy is user, nice, system, irq, softirq and steal; all adds idle and iowait."""
    try:
        with open(envvars.PROC_STAT.get(), encoding="ascii") as fh:
            for line in fh:
                if line.startswith("cpu "):
                    f = [int(x) for x in line.split()[1:]]
                    break
            else:
                return None
    except (OSError, ValueError):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    f += [0] * (8 - len(f))
    busy = f[0] + f[1] + f[2] + f[5] + f[6] + f[7]
    return busy / tick, (busy + f[3] + f[4]) / tick


class HostLoad:
    """The CPU the host spends on everything that is not the run: the host's busy CPU time (``/proc/stat``)
    over a sampler period, less the training process tree's and this process's own (the node runner and its
    sampler), as a share of the host's capacity over that period (0-100: 100 = every core busy with other
    work). None until two readings (the first primes), or where ``/proc/stat`` cannot be read."""

    def __init__(self) -> None:
        self._prev: tuple[float, float] | None = _proc_stat()
        self._self = psutil.Process()
        self._self_prev = self._own_s()

    def _own_s(self) -> float:
        try:
            t = self._self.cpu_times()
            return float(t.user + t.system)
        except psutil.Error:
            return 0.0

    def read(self, tree_cpu_s: float | None) -> float | None:
        """The other load since the last reading, the run's tree having used *tree_cpu_s* seconds in it (None:
        no tree yet, or it counted nothing)."""
        now, own = _proc_stat(), self._own_s()
        prev, own_prev = self._prev, self._self_prev
        self._prev, self._self_prev = now, own
        if now is None or prev is None:
            return None
        busy, capacity = now[0] - prev[0], now[1] - prev[1]
        if capacity <= 0:
            return None
        other = busy - (tree_cpu_s or 0.0) - max(0.0, own - own_prev)
        return min(100.0, 100.0 * max(0.0, other) / capacity)


# -- the sampler --------------------------------------------------------------------------------

def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6f}".rstrip("0").rstrip(".") if abs(v) < 1e12 else repr(v)
    return str(v)


def _row(**values: Any) -> list[str]:
    """One CSV line in the columns' order (harness.contract.formats); a column not given is empty."""
    return [_fmt(values.get(name)) for name in SAMPLE_CSV_NAMES]


class Sampler:
    """Appends rows to ``samples.<host>.csv`` every ``interval_s`` from a background thread."""

    def __init__(self, path: str | Path, interval_s: float, backend: GpuBackend | None = None,
                 root_pid: int | None = None, rapl: RaplReader | None = None) -> None:
        self.path = Path(path)
        self.interval_s = sample_interval(interval_s)
        self.backend = backend or GpuBackend()
        self.rapl = rapl
        self.tree = ProcessTree(root_pid) if root_pid else None
        self.host = HostLoad()
        self.rows = 0
        self.ticks = 0
        self.errors = 0
        self.last_error: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        new = not self.path.exists() or self.path.stat().st_size == 0
        self._fh = open(self.path, "a", newline="", encoding="utf-8")  # noqa: SIM115 - closed in stop()
        self._csv = csv.writer(self._fh, lineterminator="\n")
        if new:
            self._csv.writerow(SAMPLE_CSV_NAMES)
            self._fh.flush()

    def set_root(self, pid: int | None) -> None:
        """Follow a new training process tree (each stability trial starts a new one)."""
        with self._lock:
            self.tree = ProcessTree(pid) if pid else None
            if self.tree is not None:
                self.tree.read()  # prime at once, so the next tick already has an interval

    def end_tree(self) -> int:
        """The training process tree ended (its root reaped): write its final process row (:meth:`ProcessTree.final`)
        and the host's final other-load row (the host's CPU since the last tick less the tree's final share), with
        the devices' readings at this moment, then stop following it; returns the rows written. So the process
        and host rows cover the measured window to its end, not to the last tick before it."""
        with self._lock:
            tree, self.tree = self.tree, None
            p = tree.final() if tree is not None else None
            if p is None or self._fh.closed:
                return 0
            wall, mono = time.time(), time.monotonic()
            try:
                rows = [*self._rows(wall, mono, proc=False),
                        _row(t_wall=wall, t_mono=mono, kind="proc", device=-1, cpu_pct=p["cpu_pct"], nprocs=0)]
                other = self.host.read(p["cpu_s"])
                if other is not None:
                    rows.append(_row(t_wall=wall, t_mono=mono, kind="host", device=-1, cpu_pct=other))
            except Exception as exc:  # noqa: BLE001 - a failed reading must not stop the run
                self.errors += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                return 0
            self._csv.writerows(rows)
            self._fh.flush()
            self.rows += len(rows)
            self.ticks += 1
            return len(rows)

    def _rows(self, wall: float, mono: float, proc: bool = True) -> Iterable[list[str]]:
        # the tree first: its processes are the run's own on the GPUs (rows still go out GPU, cpu, proc, host)
        p = self.tree.read() if proc and self.tree is not None else None
        tree_s = self.tree.last_cpu_s if proc and self.tree is not None else None
        own = ({os.getpid()} | self.tree.pids) if self.tree is not None else set()
        for dev, r in zip(self.backend.devices(), self.backend.read(own)):
            yield _row(t_wall=wall, t_mono=mono, kind="gpu", device=dev.index, gpu_util=r["gpu_util"],
                       mem_used_mb=r["mem_used_mb"], mem_total_mb=r["mem_total_mb"], power_w=r["power_w"],
                       power_limit_w=r["power_limit_w"], energy_j=r.get("energy_j"),
                       foreign_procs=r.get("foreign_procs"))
        if self.rapl is not None:
            for package, energy in self.rapl.read():
                yield _row(t_wall=wall, t_mono=mono, kind="cpu", device=package, energy_j=energy)
        if p is not None:
            yield _row(t_wall=wall, t_mono=mono, kind="proc", device=-1, cpu_pct=p["cpu_pct"],
                       mem_pct=p["mem_pct"], rss_mb=p["rss_mb"], nprocs=p["nprocs"])
        if proc:
            other = self.host.read(tree_s)
            if other is not None:
                yield _row(t_wall=wall, t_mono=mono, kind="host", device=-1, cpu_pct=other)

    def tick(self, proc: bool = True) -> int:
        """Take one sample now (without the process row unless *proc*); returns the number of rows written."""
        with self._lock:
            wall, mono = time.time(), time.monotonic()
            try:
                rows = list(self._rows(wall, mono, proc))
            except Exception as exc:  # noqa: BLE001 - a failed reading must not stop the run
                self.errors += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                return 0
            if self._fh.closed:
                return 0
            self._csv.writerows(rows)
            self._fh.flush()
            self.rows += len(rows)
            self.ticks += 1
            return len(rows)

    def _loop(self) -> None:
        t0 = time.monotonic()
        k = 0
        while not self._stop.is_set():
            self.tick()
            k += 1
            # Fixed schedule (t0 + k*interval), so slow ticks do not drift the sampling grid.
            delay = t0 + k * self.interval_s - time.monotonic()
            if delay < 0:
                k = int((time.monotonic() - t0) / self.interval_s) + 1
                delay = t0 + k * self.interval_s - time.monotonic()
            self._stop.wait(max(0.0, delay))

    def start(self) -> Sampler:
        self._thread = threading.Thread(target=self._loop, name="sbench-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> int:
        """Stop the thread, take a last reading of the devices (a started sampler: so that the energy
        counters cover the end of training) and of the process tree when it still runs (a pack's point that
        ended while the training process goes on), close the file; returns the number of rows."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            if not self._thread.is_alive():
                self.tick(proc=self.tree is not None)
        with self._lock:
            if not self._fh.closed:
                self._fh.close()
        self.backend.close()
        return self.rows
