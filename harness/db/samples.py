"""The sampler's CSVs in the database: loaded in bulk by DuckDB's CSV reader, the lines it skipped and why,
and per-window statistics for the measurements. (The CSV format has its home in ``harness.contract``.)"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import duckdb

from harness.contract.errors import CollectError
from harness.contract.formats import SAMPLE_CSV_COLUMNS, SAMPLE_CSV_NAMES

from .schema import SCHEMA, q
from .staging import frame
from .store import Store

# What collect's reader asks for: the samples CSV's columns (harness.contract.formats), with ``kind`` read
# straight into the ENUM (a kind other than gpu/proc/cpu is a rejected line with its reason, like any value
# that does not convert). An older file holds a prefix of the columns; the rest are NULL.
_SAMPLE_READ_TYPES = {**dict(SAMPLE_CSV_COLUMNS), "kind": "sample_kind"}


# Reader errors about one value; any other kind is about the whole line (see _reject_reasons).
_CSV_VALUE_ERRORS = ("CAST",)


def _sample_csv(rejects: bool, names: Sequence[str] = SAMPLE_CSV_NAMES) -> str:
    """DuckDB's reader of the sample CSVs in ``$files`` (docs/job-directory.md), files with the columns
    *names*, skipping a line that does not fit; with *rejects*, recording why in
    ``_sbench_rej``/``_sbench_rej_scan``."""
    columns = "{" + ", ".join(f"'{c}': '{_SAMPLE_READ_TYPES[c]}'" for c in names) + "}"
    keep = ", store_rejects = true, rejects_table = '_sbench_rej', rejects_scan = '_sbench_rej_scan'" \
        if rejects else ""
    return (f"""read_csv($files, columns = {columns}, header = true, auto_detect = false, delim = ',',
                         quote = '"', escape = '"', ignore_errors = true{keep})""")


def _reject_reasons(found: Sequence[tuple[Any, ...]]) -> list[tuple[str, int, str]]:
    """DuckDB's rejects, (path, line, column_idx, error_type, message) sorted, as one reason per bad value
    or, for a line whose shape is wrong (too few/many columns, bad quoting, ...), one reason for the line
    (the reader also lists each column it then could not fill, or the values it misread; those are
    consequences, not causes)."""
    by_line: dict[tuple[str, int], list[tuple[Any, ...]]] = {}
    for path, line, col, etype, msg in found:
        by_line.setdefault((str(path), int(line)), []).append((col, etype, msg))
    out: list[tuple[str, int, str]] = []
    for (path, line), errs in by_line.items():
        shape = [e for e in errs if e[1] not in _CSV_VALUE_ERRORS]
        for _col, etype, msg in (shape[:1] or errs):
            out.append((path, line, f"{etype}: {msg}"))
    return list(dict.fromkeys(out))


def next_sample_file_id(store: Store) -> int:
    """The first unused ``sample_files.file_id``."""
    return int(store.con.execute("SELECT coalesce(max(file_id) + 1, 0) FROM sample_files").fetchall()[0][0])


def load_samples(store: Store, paths: Sequence[str], first_file_id: int, rejects: bool = True,
                 names: Sequence[str] = SAMPLE_CSV_NAMES) -> tuple[int, list[tuple[str, int, str]]]:
    """Bulk-load sample CSVs into ``sample_rows`` with DuckDB's reader, one scan over all *paths*, files
    that hold the columns *names* (an older file's prefix of them: the others are NULL); the
    rows of ``paths[i]`` get ``file_id = first_file_id + i`` (the caller records the matching
    ``sample_files`` rows). Returns the row count and, with *rejects*, the rejected lines as (path,
    line, reason), one reason per line. Without *rejects* a bad line is skipped all the same, at less
    cost (the caller compares each file's rows with the count its writer recorded, and asks
    :meth:`sample_rejects` why where they differ). Touches nothing but the connection, so it may run
    in a helper thread while the caller does other (non-database) work."""
    if not paths:
        return 0, []
    cols = [c for c, _ in SCHEMA["sample_rows"] if c != "file_id" and c in names]  # the others stay NULL
    # Row order is meaningless here (every row carries its file and time): let each thread append
    # what it parsed without re-establishing the files' order.
    store.con.execute("SET preserve_insertion_order = false")
    store.con.execute("SET enable_progress_bar = false")  # a long load would draw DuckDB's own bar on stdout
    try:
        n = store.con.execute(
            f"""INSERT INTO sample_rows (file_id, {", ".join(cols)})
                SELECT CAST(file_index AS INTEGER) + {int(first_file_id)}, {", ".join(cols)}
                FROM {_sample_csv(rejects, names)}""", {"files": [str(p) for p in paths]}).fetchall()[0][0]
        found = _take_rejects(store) if rejects else []
    except duckdb.Error as exc:
        raise CollectError(f"loading samples failed: {exc}") from None
    finally:
        store.con.execute("SET preserve_insertion_order = true")
    return int(n), found


def sample_rejects(store: Store, paths: Sequence[str],
                   names: Sequence[str] = SAMPLE_CSV_NAMES) -> list[tuple[str, int, str]]:
    """The lines of sample CSVs (with the columns *names*) that :meth:`load_samples` skips, as (path, line,
    reason): the files are read again, nothing is written."""
    if not paths:
        return []
    try:
        # Every column named, so that each value is converted (count(*) alone would convert none).
        every = ", ".join(f"count({q(c)})" for c in names)
        store.con.execute(f"SELECT {every} FROM {_sample_csv(True, names)}",
                          {"files": [str(p) for p in paths]}).fetchall()
        return _take_rejects(store)
    except duckdb.Error as exc:
        raise CollectError(f"reading samples failed: {exc}") from None


def _take_rejects(store: Store) -> list[tuple[str, int, str]]:
    found = store.con.execute(
        """SELECT s.file_path, e.line, e.column_idx, e.error_type, e.error_message
           FROM _sbench_rej AS e JOIN _sbench_rej_scan AS s USING (scan_id, file_id)
           ORDER BY 1, 2, 3, 4, 5""").fetchall()
    store.con.execute("DROP TABLE IF EXISTS _sbench_rej")
    store.con.execute("DROP TABLE IF EXISTS _sbench_rej_scan")
    return _reject_reasons(found)


def sample_stats(store: Store, windows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per (run, host, kind, device) statistics of the samples in each run's measured window (``run_id``,
    ``start``, ``end``: NULL bounds = unbounded; ``interval``: the sampler's period ``d``), plus the rows
    counted outside it.

    A sample taken at ``t`` stands for the period before it, ``[t - d, t]`` (the sampler's CPU figure is
    the average over that period). The averages weigh each sample by the length of that period inside the
    window, so a window sees exactly the time it spans: the first sample after it counts for the part of
    its period before the window's end, one at (or just after) the start for the part after it, and a
    sample with no overlap not at all. ``samples`` (and ``mem_util_peak``, the highest single reading)
    are the samples whose time falls inside the window, its bounds included.

    ``cpu_cover`` is the seconds of the window the rows with a ``cpu_pct`` cover (the sum of their weights);
    ``foreign_max`` the most processes not the run's that a GPU's samples inside the window saw. A ``host`` row's
    ``cpu_pct`` average is the host's other load over the window.

    Also the energy counter around the window's edges: ``energy_rows`` (rows with an ``energy_j``), and at
    each edge (``lo``, ``hi``) the last reading at or before it (``e_<edge>_t0``, ``e_<edge>_e0``) and the
    first at or after it (``e_<edge>_t1``, ``e_<edge>_e1``), for :func:`harness.collect.aggregate.energy_stats`."""
    if not windows:
        return []
    tbl = frame([("run_id", "VARCHAR"), ("w_start", "DOUBLE"), ("w_end", "DOUBLE"), ("w_d", "DOUBLE")],
                [{"run_id": w["run_id"], "w_start": w.get("start"), "w_end": w.get("end"),
                  "w_d": w.get("interval")} for w in windows])
    store.con.register("_sbench_win", tbl)
    try:
        # Aggregate on the small integer key (one file = one run and host) split by in/out of the
        # window (cheaper than filtered aggregates), GPU and process rows apart (each kind updates only
        # its own aggregates; the GPU rows' kind is known, so not hashed), fold the split, then name the
        # files. ``x`` is a row's weight: its period's overlap with the window, NULL where there is none
        # (so a value outside the window, even NaN, never reaches a sum). Each average is the sum of
        # weight x value over the sum of the weights of the rows that have the value.
        x = "nullif(greatest(least(s.t_wall, w.hi) - greatest(s.t_wall - w.d, w.lo), 0), 0)"
        inw = "coalesce(s.t_wall BETWEEN w.lo AND w.hi, false)"

        # fsum (Kahan-Babuska): a compensated sum, so the order the rows are stored or scanned in moves a
        # figure by at most its last bit (threads combine their partial sums in the order they finish).
        def wsum(value: str, name: str) -> str:
            return (f"fsum(x * ({value})) AS {name}_xv, "
                    f"fsum(CASE WHEN ({value}) IS NOT NULL THEN x END) AS {name}_x")

        def wavg(name: str) -> str:
            return f"fsum({name}_xv) / nullif(fsum({name}_x), 0) AS {name}"

        mem = "100.0 * mem_used_mb / nullif(mem_total_mb, 0)"
        pct = "100.0 * power_w / nullif(power_limit_w, 0)"
        gpu_names = ("gpu_util", "mem_util", "power_w", "power_pct")
        proc_names = ("cpu_pct", "mem_pct")

        def null_pairs(names: Sequence[str]) -> str:
            return ", ".join(f"NULL::DOUBLE AS {n}_xv, NULL::DOUBLE AS {n}_x" for n in names)

        return store.fetch_dicts(f"""
            WITH w AS (SELECT f.file_id, coalesce(x.w_start, '-infinity'::DOUBLE) AS lo,
                              coalesce(x.w_end, 'infinity'::DOUBLE) AS hi, x.w_d AS d
                       FROM sample_files f JOIN _sbench_win x USING (run_id)),
                 r AS (SELECT s.*, {inw} AS inw, {x} AS x FROM sample_rows s JOIN w USING (file_id)),
                 g AS (
                SELECT file_id, 'gpu'::sample_kind AS kind, device, inw, count(*) AS n,
                       {wsum("gpu_util", "gpu_util")}, {wsum(mem, "mem_util")},
                       max({mem}) AS mem_util_peak,
                       {wsum("power_w", "power_w")}, {wsum(pct, "power_pct")},
                       {null_pairs(proc_names)}, NULL::DOUBLE AS rss_mb_max,
                       max(foreign_procs) AS foreign_max
                FROM r
                WHERE kind = 'gpu'
                GROUP BY file_id, device, inw
                UNION ALL
                SELECT file_id, kind, device, inw, count(*) AS n,
                       {null_pairs(gpu_names[:2])}, NULL, {null_pairs(gpu_names[2:])},
                       {wsum("cpu_pct", "cpu_pct")}, {wsum("mem_pct", "mem_pct")}, max(rss_mb), NULL::INTEGER
                FROM r
                WHERE kind <> 'gpu'
                GROUP BY ALL),
                 a AS (
                SELECT file_id, kind, device, CAST(sum(n) AS BIGINT) AS rows_all,
                       CAST(coalesce(sum(n) FILTER (WHERE inw), 0) AS BIGINT) AS samples,
                       {wavg("gpu_util")}, {wavg("mem_util")},
                       max(mem_util_peak) FILTER (WHERE inw) AS mem_util_peak,
                       {wavg("power_w")}, {wavg("power_pct")}, {wavg("cpu_pct")}, {wavg("mem_pct")},
                       fsum(cpu_pct_x) AS cpu_cover, max(rss_mb_max) AS rss_mb_max,
                       max(foreign_max) FILTER (WHERE inw) AS foreign_max
                FROM g GROUP BY file_id, kind, device),
                 e AS (
                SELECT file_id, kind, device, count(*) AS energy_rows,
                       max(t_wall) FILTER (WHERE t_wall <= lo) AS e_lo_t0,
                       arg_max(energy_j, t_wall) FILTER (WHERE t_wall <= lo) AS e_lo_e0,
                       min(t_wall) FILTER (WHERE t_wall >= lo) AS e_lo_t1,
                       arg_min(energy_j, t_wall) FILTER (WHERE t_wall >= lo) AS e_lo_e1,
                       max(t_wall) FILTER (WHERE t_wall <= hi) AS e_hi_t0,
                       arg_max(energy_j, t_wall) FILTER (WHERE t_wall <= hi) AS e_hi_e0,
                       min(t_wall) FILTER (WHERE t_wall >= hi) AS e_hi_t1,
                       arg_min(energy_j, t_wall) FILTER (WHERE t_wall >= hi) AS e_hi_e1
                FROM sample_rows s JOIN w USING (file_id)
                WHERE s.energy_j IS NOT NULL AND s.t_wall IS NOT NULL
                GROUP BY file_id, kind, device)
            SELECT f.run_id, f.host, CAST(a.kind AS VARCHAR) AS kind, a.device, a.rows_all, a.samples,
                   a.gpu_util, a.mem_util, a.mem_util_peak, a.power_w, a.power_pct, a.cpu_pct, a.mem_pct,
                   a.cpu_cover, a.foreign_max, a.rss_mb_max, coalesce(e.energy_rows, 0) AS energy_rows,
                   e.e_lo_t0, e.e_lo_e0, e.e_lo_t1, e.e_lo_e1, e.e_hi_t0, e.e_hi_e0, e.e_hi_t1, e.e_hi_e1
            FROM a JOIN sample_files f USING (file_id) LEFT JOIN e USING (file_id, kind, device)
            ORDER BY f.run_id, f.host, a.kind, a.device""")
    finally:
        store.con.unregister("_sbench_win")
