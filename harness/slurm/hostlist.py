"""SLURM host lists: ``gpu-a[01-03,07],node9`` as the node names it stands for."""

from __future__ import annotations

import re


# -- SLURM host lists ---------------------------------------------------------------------------------------
def expand_hostlist(text: str | None) -> list[str]:
    """``gpu-a[01-03,07],node9`` -> ``['gpu-a01', 'gpu-a02', 'gpu-a03', 'gpu-a07', 'node9']``."""
    if not text or text.strip() in ("", "None assigned", "(null)", "None"):
        return []
    out: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", text):
        out.extend(_expand_one(part.strip()))
    return [h for h in out if h]


def _expand_one(part: str) -> list[str]:
    m = re.search(r"\[([^\]]*)\]", part)
    if not m:
        return [part]
    head, tail = part[:m.start()], part[m.end():]
    names = []
    for rng in m.group(1).split(","):
        if "-" in rng:
            a, b = rng.split("-", 1)
            width = len(a) if a.startswith("0") else 0
            for n in range(int(a), int(b) + 1):
                names.append(f"{head}{n:0{width}d}")
        else:
            names.append(f"{head}{rng}")
    return [x for name in names for x in _expand_one(name + tail)]
