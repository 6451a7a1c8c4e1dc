"""The contract layer: each shared fact has one home, and the code takes it from there.

Checked here: every ``SBENCH_*`` name the package mentions is listed in harness/contract/envvars.py and
read only through it; the node name follows launch.sh's rule; the runner settings survive spec.json, old
and odd ones included; the two forms of the response template are one; dataset file names agree with the
dataset generator; the sampler writes the documented columns.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.contract import envvars
from harness.contract.defaults import RunnerSettings
from harness.contract.formats import RESPONSE_TEMPLATE, RESPONSE_TEMPLATE_ARG, SAMPLE_CSV_NAMES
from harness.contract.paths import dataset_filename
from harness.data.datagen import parse_dataset_id
from harness.data.tokens import decode_template
from harness.runner.sampler import FakeNvml, NvmlBackend, Sampler
from harness.spec.catalog import DATASET_IDS

PACKAGE = Path(__file__).resolve().parent.parent / "harness"
NAME = re.compile(r"\bSBENCH_[A-Z][A-Z0-9_]*")
DIRECT_READ = re.compile(r"""(environ\.get\(|environ\[|getenv\()\s*["']SBENCH_""")
# These read their own variables until they take them from harness.contract.envvars too.
NOT_YET_SWITCHED: tuple[str, ...] = ()


def _package_files() -> list[Path]:
    return [p for p in PACKAGE.rglob("*") if p.suffix in (".py", ".j2", ".yaml") and p.is_file()]


def test_every_sbench_variable_the_package_mentions_is_listed() -> None:
    listed = {v.name for v in envvars.VARS}
    own = PACKAGE / "contract" / "envvars.py"
    unlisted = {f"{p.relative_to(PACKAGE)}: {name}" for p in _package_files() if p != own
                for name in NAME.findall(p.read_text(encoding="utf-8")) if name not in listed}
    assert not unlisted, sorted(unlisted)
    assert len(listed) == len(envvars.VARS)
    assert all(v.meaning and v.kind in ("login", "job", "tests") for v in envvars.VARS)


def test_sbench_variables_are_read_only_through_the_contract() -> None:
    direct = [f"{p.relative_to(PACKAGE)}:{n}" for p in _package_files() if p.suffix == ".py"
              and not str(p.relative_to(PACKAGE)).startswith(NOT_YET_SWITCHED)
              for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if DIRECT_READ.search(line)]
    assert not direct, direct


def test_a_variable_reads_its_value_else_its_default() -> None:
    assert envvars.SAMPLER_BACKEND.get({}) == "nvml"
    assert envvars.SAMPLER_BACKEND.get({"SBENCH_SAMPLER_BACKEND": ""}) == "nvml"  # empty is unset
    assert envvars.SAMPLER_BACKEND.get({"SBENCH_SAMPLER_BACKEND": "fake"}) == "fake"
    assert envvars.FAULT.get({}) == ""


def test_node_name_follows_launch_sh() -> None:
    launch = (PACKAGE / "templates" / "launch.sh.j2").read_text()
    assert 'HOST="${SLURMD_NODENAME:-${SBENCH_HOST:-$(hostname -s)}}"' in launch
    assert envvars.host({"SLURMD_NODENAME": "n1", "SBENCH_HOST": "h"}) == "n1"
    assert envvars.host({"SBENCH_HOST": "h"}) == "h"
    short = envvars.host({})
    assert short and "." not in short


def test_runner_settings_survive_spec_json() -> None:
    custom = RunnerSettings(sample_interval_s=0.05, min_steps=3, token_cache=False, workload="idle")
    assert RunnerSettings.from_dict(custom.to_dict()) == custom
    assert RunnerSettings.from_dict(None) == RunnerSettings()
    # An older spec.json, and one with odd values: what is missing or unusable takes its default.
    old = RunnerSettings.from_dict({"sample_interval_s": 2, "retired_key": 1, "memory_every_steps": None,
                                    "min_steps": "x", "token_cache": "no", "stop_grace_s": True})
    assert old == RunnerSettings(sample_interval_s=2.0)
    assert isinstance(old.sample_interval_s, float)


def test_the_response_template_has_one_form_for_text_and_one_for_the_command_line() -> None:
    assert RESPONSE_TEMPLATE_ARG == "\\n### Response:"
    assert decode_template(RESPONSE_TEMPLATE_ARG) == RESPONSE_TEMPLATE


@pytest.mark.parametrize("dataset_id", DATASET_IDS)
def test_dataset_file_names_agree_with_the_generator(dataset_id: str) -> None:
    spec = parse_dataset_id(dataset_id)
    assert dataset_filename(dataset_id) == spec.filename
    assert spec.filename.endswith(".parquet") == (spec.kind == "vision")


def test_the_sampler_writes_the_contract_columns(tmp_path: Path) -> None:
    path = tmp_path / "samples.h.csv"
    sampler = Sampler(path, 1.0, NvmlBackend(FakeNvml(1), max_devices=1))
    sampler.tick()
    sampler.stop()
    # (the tick's row; on a loaded machine the background thread may have ticked too before stop)
    header, *rows = path.read_text().splitlines()
    assert header.split(",") == list(SAMPLE_CSV_NAMES) and rows
    assert all(len(r.split(",")) == len(SAMPLE_CSV_NAMES) for r in rows)
    assert dict(zip(SAMPLE_CSV_NAMES, rows[0].split(",")))["kind"] == "gpu"
