"""Campaigns a test reads: :class:`Campaign`, a handle on one (its work dir, database and name, its manifest and
rows), and :class:`Trained`, the session's trained campaigns (built once by :func:`build_trained`, read by many
tests, copied by those that change them)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .builders import sweep, write_yaml
from .cli import sbench
from .secrets import secret_inventory
from .sql import sql_rows


@dataclass(frozen=True)
class Campaign:
    """One campaign of a work dir, and the database its runs are collected into."""

    workdir: Path
    db: Path
    name: str

    @property
    def common(self) -> list[Any]:
        """``--workdir W --db D``: the options every command that acts on it takes."""
        return ["--workdir", self.workdir, "--db", self.db]

    @property
    def dir(self) -> Path:
        return self.workdir / self.name

    def manifest(self, kind: str | None = None) -> list[dict[str, Any]]:
        """Its manifest's lines, in order (of one ``type`` when *kind* is given)."""
        lines = [json.loads(x) for x in (self.dir / "manifest.jsonl").read_text().splitlines() if x.strip()]
        return [e for e in lines if kind is None or e.get("type") == kind]

    def rows(self, query: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
        """Rows of *query* against its database (any campaign's: filter by ``campaign = ?`` where it matters)."""
        return sql_rows(self.db, query, params)

    def runs(self) -> list[dict[str, Any]]:
        """Its runs, ordered by run id."""
        return self.rows("SELECT * FROM runs WHERE campaign = ? ORDER BY run_id", [self.name])

    def measurements(self) -> list[dict[str, Any]]:
        """Its runs' measurements, ordered by run id."""
        return self.rows("SELECT * FROM measurements WHERE campaign = ? ORDER BY run_id", [self.name])


# -- the session's trained campaigns -------------------------------------------------------------------------------
TRAINED_PEAK_TFLOPS = 0.05  # one CPU worker process's peak, as the trained campaigns' inventory declares it
TRAINED_PRICE = 2.5  # one CPU worker process an hour, as the trained campaigns' inventory prices it
TRAINED_CAMPAIGNS = ("nightly-1", "nightly-2")


@dataclass(frozen=True)
class Trained:
    """Two campaigns of one sweep (``nightly-1``, then ``nightly-2``: full fine-tuning of the tiny model, batch 2
    and 4, 4 steps, model_max_length 256, one process, bfloat16 asked on a CPU), trained through the local
    executor and collected.

    The inventory holds every secret of :data:`tests.kit.secrets.SECRETS` and runs the jobs through a python
    wrapper that records the hash of the ``HF_TOKEN`` it sees in ``marks/``; it declares a peak of
    :data:`TRAINED_PEAK_TFLOPS`. ``submits`` holds the first submit's JSON and the second's text (stdout and
    stderr). Read these files; a test that changes anything (submits, collects, puts files in) takes :meth:`copy`
    first."""

    root: Path

    @property
    def inventory(self) -> Path:
        return self.root / "inv.yaml"

    @property
    def sweep(self) -> Path:
        return self.root / "nightly.yaml"

    @property
    def workdir(self) -> Path:
        return self.root / "runs"

    @property
    def db(self) -> Path:
        return self.root / "results.duckdb"

    @property
    def marks(self) -> Path:
        return self.root / "marks"

    @property
    def common(self) -> list[Any]:
        return ["--workdir", self.workdir, "--db", self.db]

    @property
    def local(self) -> list[Any]:
        """The options of a submit of the sweep like the ones that made these campaigns."""
        return ["-i", self.inventory, "--executor", "local", *self.common]

    @property
    def submits(self) -> dict[str, Any]:
        return json.loads((self.root / "submits.json").read_text())

    def campaign(self, name: str = TRAINED_CAMPAIGNS[0]) -> Campaign:
        """One of the two campaigns, as a :class:`Campaign`."""
        return Campaign(self.workdir, self.db, name)

    def copy(self, dst: Path) -> Trained:
        """The campaigns as if they had been trained in *dst*: the files copied, every path they record that is
        under :attr:`root` moved under *dst*, the database left out (collect the copy: it costs a second)."""
        old, new = str(self.root), str(dst)
        shutil.copytree(self.root, dst, symlinks=True, ignore=shutil.ignore_patterns("results.duckdb*"))
        for dirpath, _dirs, names in os.walk(dst):
            for name in names:
                p = Path(dirpath) / name
                if p.is_symlink() or not p.is_file():
                    continue
                data = p.read_bytes()
                if old.encode() in data:
                    mode = p.stat().st_mode
                    p.write_bytes(data.replace(old.encode(), new.encode()))
                    p.chmod(mode)
        return Trained(dst)


def build_trained(root: Path, model: Path, data_dir: Path) -> None:
    """Train and collect the campaigns :class:`Trained` describes, into *root*."""
    t = Trained(root)
    t.marks.mkdir()
    wrapper = root / "python-wrapper"
    wrapper.write_text("#!/bin/sh\n"
                       f'printf %s "$HF_TOKEN" | sha256sum | cut -d" " -f1 > "{t.marks}/hf.$$"\n'
                       f'exec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    inv = secret_inventory(python=str(wrapper))
    inv["partitions"]["cpu"]["peak_tflops"] = TRAINED_PEAK_TFLOPS
    inv["partitions"]["cpu"]["price_per_gpu_hour"] = TRAINED_PRICE
    write_yaml(t.inventory, inv)
    write_yaml(t.sweep, sweep(model, data_dir, campaign=TRAINED_CAMPAIGNS[0], partition="cpu",
                              entity={"model_max_length": 256, "max_steps": 4, "torch_dtype": "bfloat16"},
                              grid={"batch_size": [2, 4]}, runner={"sample_interval_s": 0.1}))
    submits = {}
    for campaign, as_json in zip(TRAINED_CAMPAIGNS, (True, False)):  # the first in JSON, the second as text
        proc = sbench("submit", t.sweep, "--campaign", campaign, "--wait", *(["--json"] if as_json else []), *t.local)
        submits[campaign] = {"json": json.loads(proc.stdout)} if as_json else {"stdout": proc.stdout,
                                                                                "stderr": proc.stderr}
        sbench("collect", *t.common)
    (root / "submits.json").write_text(json.dumps(submits, indent=1))
