"""bench/gpu_more.sh's third part, said: per point of the FSDP one-rank campaign, what it ran (the backend asked,
the distributed type and process count its rank 0 recorded in ``rank.0.json``, and the plan's note on the backend,
``points.notes``) and the memory prediction against
the CUDA allocator's peak (``measurements.predicted_total_bytes`` / ``memory_peak_bytes`` - 1; none on a CPU).

    python bench/gpu_more_fsdp.py ROWS.json OUT.json      # ROWS: sbench query --format json of the campaign's runs
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def gb(b: Any) -> str:
    return "-" if b is None else f"{b / 1e9:.3g} GB"


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        rank = Path(str(r.get("job_dir") or "")) / "rank.0.json"
        doc = json.loads(rank.read_text()) if rank.is_file() else {}
        dist = doc.get("distributed") or {}
        pred, peak = r.get("predicted_total_bytes"), r.get("memory_peak_bytes")
        notes = [n for n in r.get("notes") or [] if n.startswith("distributed_backend")]
        out.append({**r, "distributed_type": dist.get("distributed_type"), "num_processes": dist.get("num_processes"),
                    "backend_note": notes[0] if notes else None,
                    "memory_error": pred / peak - 1 if pred and peak else None})
    return out


def main() -> None:
    rows = json.loads(Path(sys.argv[1]).read_text())
    out = summarise(rows)
    Path(sys.argv[2]).write_text(json.dumps(out, indent=1))
    for r in out:
        err = "-" if r["memory_error"] is None else f"{100 * r['memory_error']:+.1f} %"
        print(f"fsdp one rank, gradient_checkpointing {r['gradient_checkpointing']}: {r['outcome']}; ran "
              f"{r['distributed_type']} x {r['num_processes']} ({r['backend_note'] or 'no note'}); memory predicted "
              f"{gb(r['predicted_total_bytes'])} vs CUDA peak {gb(r['memory_peak_bytes'])} ({err}); activations "
              f"predicted {gb(r['predicted_activation_bytes'])} vs measured {gb(r['activation_bytes'])}")
    if len(out) != 2 or any(r["outcome"] != "ok" for r in out):
        print("gpu_more_fsdp: not every FSDP point ran ok", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
