"""The campaign's records (harness.contract.records): a manifest line and submitted.json each have one writer and
one reader; what earlier releases wrote still reads, and a key no record lists is an error naming the file and
the key."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from harness.contract.errors import RecordError
from harness.contract.paths import CampaignPaths, JobPaths
from harness.contract.records import (
    LINE_TYPES,
    append_manifest,
    attempt_line,
    check_line,
    parse_manifest,
    read_manifest,
    read_submitted,
    write_submitted,
)
from harness.db.manifest import record_manifest
from harness.db.store import open_store

PID = "0123456789abcdef"
JD = f"/abs/results/runs/scan/{PID}.r0.a1"

# Each line as the releases before the records were typed wrote it (json.dumps, keys in the writer's order).
WRITTEN = [
    # submit's campaign line, and an older one (no sweep_campaign, cluster, description or repeats yet)
    {"type": "campaign", "campaign": "scan", "experiment": "finetune_lora_benchmark-v1.0.0",
     "sweep": "/abs/sweeps/lora.yaml", "sweep_campaign": "scan", "inventory": "/abs/inventory/x.yaml",
     "cluster": "vela", "partition": "a100", "executor": "slurm", "description": None,
     "created_at": "2026-01-02T03:04:05+0000", "sbench_version": "0.1.0",
     "references": [{"metric": "train_tokens_per_second", "min": 100}], "repeats": {"min": 2, "max": 5, "cv": 0.05}},
    {"type": "campaign", "campaign": "scan", "experiment": "finetune_lora_benchmark-v1.0.0",
     "sweep": "/abs/sweeps/lora.yaml", "inventory": "inventory/x.yaml", "partition": "a100", "executor": "slurm",
     "created_at": "2025-11-21T23:58:00+00:00", "sbench_version": "0.1.0"},
    {"type": "references", "campaign": "scan", "at": "2026-01-02T03:04:05+0000", "references": []},
    {"type": "repeats", "campaign": "scan", "at": "2026-01-02T03:04:05+0000", "repeats": None},
    # a point line (PlannedPoint.to_dict, with plan --memory's prediction), and an older one
    {"type": "point", "campaign": "scan", "point_id": PID, "repeat": 0, "experiment": "finetune_lora_benchmark-v1.0.0",
     "entity": {"batch_size": 8}, "valid": True, "reasons": [], "notes": [], "partition": "a100",
     "model_source": "/models/tiny", "warnings": [], "memory": {"predicted_oom": False}, "predicted_oom": False},
    {"type": "point", "campaign": "scan", "point_id": PID, "repeat": 0, "experiment": "x", "entity": {},
     "valid": False, "reasons": ["rule 1"], "notes": []},
    # submit's attempt line on SLURM (the feed's extra: job name, time, pack), held back, and locally queued
    {"type": "attempt", "campaign": "scan", "point_id": PID, "repeat": 0, "attempt": 1, "job_dir": JD,
     "executor": "slurm", "job_id": "1234_5", "array_job_id": "1234", "array_task_id": 5,
     "submitted_at": "2026-01-02T03:04:05+0000", "reason": "new", "job_name": "sbench.scan.shape0",
     "pack_index": 1, "pack_size": 2, "pack_lead": JD},
    {"type": "attempt", "campaign": "scan", "point_id": PID, "repeat": 0, "attempt": 1, "job_dir": JD,
     "executor": "slurm", "job_id": None, "array_job_id": None, "array_task_id": None,
     "submitted_at": "2026-01-02T03:04:05+0000", "reason": "new", "held_back": True},
    {"type": "attempt", "campaign": "scan", "point_id": PID, "repeat": 0, "attempt": 1, "job_dir": JD,
     "executor": "local", "job_id": None, "array_job_id": None, "array_task_id": None,
     "submitted_at": "2026-01-02T03:04:05+0000", "reason": "retry", "queue": "/abs/.local/queue-1.json"},
    # the feeder job's line, and a pack's requeue after an OOM
    {"type": "attempt", "campaign": "scan", "point_id": PID, "repeat": 0, "attempt": 1, "job_dir": JD,
     "executor": "slurm", "job_id": "99_0", "array_job_id": "99", "array_task_id": 0,
     "submitted_at": "2026-01-02T03:04:05+0000", "reason": "fed", "job_name": "sbench.scan.shape0", "fed": True},
    {"type": "attempt", "campaign": "scan", "point_id": PID, "repeat": 0, "attempt": 1, "job_dir": JD,
     "executor": "slurm", "job_id": "100", "array_job_id": None, "array_task_id": None,
     "submitted_at": "2026-01-02T03:04:05+0000",
     "reason": "requeued unpacked: an earlier point of its pack ran out of GPU memory", "job_name": "sbench.scan.x",
     "requeued_from": "1234_5"},
    # a point its local pack put back in the queue (no job id until the queue starts it)
    {"type": "attempt", "campaign": "scan", "point_id": PID, "repeat": 0, "attempt": 1, "job_dir": JD,
     "executor": "local", "job_id": None, "array_job_id": None, "array_task_id": None,
     "submitted_at": "2026-01-02T03:04:05+0000",
     "reason": "requeued unpacked: an earlier point of its pack ran out of GPU memory",
     "requeued_at": "2026-01-02T03:04:05+0000"},
    # an older attempt line: no repeat (repeat 0), no reason, no array ids
    {"type": "attempt", "campaign": "scan", "point_id": PID, "attempt": 2, "job_dir": JD, "executor": "slurm",
     "job_id": "77"},
    {"type": "cancel", "campaign": "scan", "job_ids": ["1234_5"], "job_dirs": [JD], "at": "2026-01-02T03:04:05+0000"},
    {"type": "cancel", "campaign": "scan", "job_ids": ["1234_5"], "job_dirs": [JD]},
    # a search's decision about a point (search:)
    {"type": "search", "campaign": "scan", "point_id": PID, "at": "2026-01-02T03:04:05+0000", "phase": "fit",
     "action": "skipped", "reason": "bounded above by batch 8 OOM", "repeat": None},
    # a search campaign's line: its search: and the grid's points as the search sees them
    {"type": "campaign", "campaign": "scan", "experiment": "finetune_lora_benchmark-v1.0.0",
     "sweep": "/abs/sweeps/lora.yaml", "sweep_campaign": "scan", "inventory": "/abs/inventory/x.yaml",
     "cluster": "vela", "partition": "a100", "executor": "slurm", "description": None,
     "created_at": "2026-01-02T03:04:05+0000", "sbench_version": "0.1.0", "references": [], "repeats": None,
     "search": {"goal": {"maximize": "dataset_tokens_per_second"}, "batch_size": "fit", "method": "halving",
                "eta": 3, "grid_fields": ["batch_size"], "repeats": 1,
                "points": [{"point_id": PID, "entity": {"batch_size": 4}, "total_bytes": 1e9, "device_bytes": 8e10,
                            "predicted_oom": False}]}},
    # a campaign line with its budget:, the budget changed since, and an attempt with what submit predicted of it
    {"type": "campaign", "campaign": "scan", "experiment": "finetune_lora_benchmark-v1.0.0",
     "sweep": "/abs/sweeps/lora.yaml", "sweep_campaign": "scan", "inventory": "/abs/inventory/x.yaml",
     "cluster": "vela", "partition": "a100", "executor": "slurm", "description": None,
     "created_at": "2026-01-02T03:04:05+0000", "sbench_version": "0.1.0", "references": [], "repeats": None,
     "budget": {"gpu_hours": 100.0, "allocation_hours": None}},
    {"type": "budget", "campaign": "scan", "at": "2026-01-02T03:04:05+0000",
     "budget": {"gpu_hours": 200.0, "allocation_hours": 30.0}},
    {"type": "attempt", "campaign": "scan", "point_id": PID, "repeat": 0, "attempt": 3, "job_dir": JD,
     "executor": "slurm", "job_id": "1300_0", "array_job_id": "1300", "array_task_id": 0,
     "submitted_at": "2026-01-02T03:04:05+0000", "reason": "new",
     "prediction": {"predicted_seconds": 120.5, "predicted_low_s": 100.0, "predicted_high_s": 150.0,
                    "prediction_source": "model", "prediction_basis": "FLOP model: ..."}},
]

# submitted.json as each of its writers wrote it, and as older releases did
SUBMITTED = [
    {"executor": "local", "job_id": None, "rendered_at": "t",
     "not_started_reason": "not started: the submit that rendered it stopped before handing it to the executor"},
    {"executor": "local", "job_id": None, "queue": "/abs/.local/queue-1.json", "submitted_at": "t",
     "pack": {"index": 0, "size": 2, "job_dirs": [JD, JD]}},
    {"executor": "local", "job_id": "4242", "queue": "/q.json", "submitted_at": "t", "queued_at": "t", "pid": 4243,
     "started_at": "t", "exit_code": -15, "ended_at": "t", "exit_signal": 15},
    {"executor": "local", "job_id": None, "queue": "/q.json", "submitted_at": "t", "cancelled_at": "t"},
    {"executor": "local", "job_id": None, "queue": "/q.json", "submitted_at": "t", "not_started_at": "t",
     "not_started_reason": "not started: its local queue stopped on signal 15 first"},
    {"executor": "local", "job_id": None, "queue": "/q.json", "submitted_at": "t", "requeued_at": "t", "pack": None},
    {"executor": "local", "job_id": "1", "started_at": None, "ended_at": "t", "exit_code": 0, "pack_lead": JD},
    {"executor": "slurm", "job_id": "1234_5", "array_job_id": "1234", "array_task_id": 5, "submitted_at": "t",
     "job_name": "sbench.scan.shape0", "fed_at": "t", "pack": {"index": 1, "size": 2, "job_dirs": [JD, JD]}},
    {"executor": "slurm", "job_id": None, "held_back_at": "t"},
    {"executor": "slurm", "job_id": None, "held_back_at": "t", "cancelled_at": "t"},
    {"executor": "slurm", "job_id": "100", "submitted_at": "t", "job_name": "x", "requeued_from": "1234_5",
     "requeued_at": "t"},
    {"cancelled_at": "2026-01-01T00:00:00"},
    # older releases: the submit time under another name, and the launch's process as they recorded it
    {"executor": "slurm", "job_id": "1000_0", "submit_time": "2025-11-21T23:59:30+00:00"},
    {"executor": "local", "pid": 4243, "process": {"pid": 4243, "create_time": 1.5, "needle": "sleep"}},
]


def _text(lines: list[dict]) -> bytes:
    return "".join(json.dumps(x) + "\n" for x in lines).encode()


def test_every_line_todays_and_older_releases_wrote_reads_unchanged() -> None:
    lines, problems = parse_manifest(_text(WRITTEN), "manifest.jsonl")
    assert problems == []
    assert lines == WRITTEN
    assert {x["type"] for x in lines} == set(LINE_TYPES)


def test_the_database_records_every_line_written_so_far(tmp_path: Path) -> None:
    with open_store(tmp_path / "r.duckdb") as st:
        assert record_manifest(st, WRITTEN) == []
        # the newest budget line's word, and the prediction of the attempt that carried one
        (spec,) = st.con.execute("SELECT budget_spec FROM campaigns WHERE campaign = 'scan'").fetchone()
        assert json.loads(spec) == {"gpu_hours": 200.0, "allocation_hours": 30.0}
        rows = st.con.execute("SELECT attempt, predicted_seconds, predicted_low_s, predicted_high_s, prediction_source "
                              "FROM runs ORDER BY attempt").fetchall()
        assert rows[-1] == (3, 120.5, 100.0, 150.0, "model") and all(r[1] is None for r in rows[:-1])


@pytest.mark.parametrize("info", SUBMITTED)
def test_every_submitted_json_written_so_far_reads_unchanged(tmp_path: Path, info: dict) -> None:
    jd = tmp_path / "scan" / f"{PID}.r0.a1"
    jd.mkdir(parents=True)
    JobPaths(jd).submitted.write_text(json.dumps(info, indent=2))
    problems: list[str] = []
    assert read_submitted(jd, problems=problems) == info
    assert problems == []
    write_submitted(jd, read_submitted(jd))  # its one writer writes it back as it was
    assert json.loads(JobPaths(jd).submitted.read_text()) == info


def test_a_key_no_line_lists_and_a_missing_key_are_problems_naming_the_file_line_and_key() -> None:
    text = _text([WRITTEN[0], {**WRITTEN[6], "job_state": "x"}, {"type": "point", "campaign": "scan"},
                  {"type": "bogus", "campaign": "scan"}, WRITTEN[13]])
    lines, problems = parse_manifest(text + b'{"type": "attempt", "campaign"', "manifest.jsonl")
    assert lines == [WRITTEN[0], WRITTEN[13]]
    assert problems == [
        "manifest.jsonl line 6: truncated JSON",
        "manifest.jsonl line 2: attempt line is malformed: unknown key 'job_state' (known: array_job_id, "
        "array_task_id, attempt, campaign, executor, fed, held_back, job_dir, job_id, job_name, pack_index, "
        "pack_lead, pack_size, point_id, prediction, queue, reason, repeat, requeued_at, requeued_from, submitted_at, "
        "type)",
        "manifest.jsonl line 3: point line is malformed: it lacks the key 'point_id'",
        "manifest.jsonl line 4: unknown type 'bogus' (expected campaign, point, attempt, cancel, references, "
        "repeats, budget or search)",
    ]
    with pytest.raises(RecordError, match="not a JSON object"):
        check_line([1])
    with pytest.raises(RecordError, match="unknown type"):
        check_line({"type": ["attempt"]})


def test_a_submitted_json_with_a_key_it_does_not_list_is_not_read_and_says_which(tmp_path: Path) -> None:
    jd = tmp_path / "scan" / f"{PID}.r0.a1"
    jd.mkdir(parents=True)
    JobPaths(jd).submitted.write_text(json.dumps({"executor": "local", "pidd": 3}))
    problems: list[str] = []
    assert read_submitted(jd, problems=problems) == {}
    assert len(problems) == 1 and problems[0].startswith("submitted.json: unknown key 'pidd' (known: ")
    JobPaths(jd).submitted.write_text("[1, 2]")
    assert read_submitted(jd, problems=problems) == {} and problems[-1] == "submitted.json: not a JSON object"
    with pytest.raises(RecordError, match="unknown key 'pidd'"):
        write_submitted(jd, {"pidd": 3})  # type: ignore[typeddict-unknown-key]
    assert read_submitted(tmp_path / "scan" / "missing.r0.a1", problems=problems) == {} and len(problems) == 2


def test_the_one_writer_puts_type_first_refuses_a_bad_line_whole_and_the_reader_reads_it_back(tmp_path: Path) -> None:
    camp = CampaignPaths(tmp_path / "scan")
    line = attempt_line("scan", PID, 0, 1, JD, "slurm", "1234_5", "t", "new", array_job_id="1234", array_task_id=5,
                        extra={"job_name": "n", "submitted_at": "later"})
    assert line["submitted_at"] == "later"  # the executor's word wins
    append_manifest(camp, [WRITTEN[0], {"repeat": 0, **WRITTEN[4]}, line])  # type: ignore[list-item]
    with pytest.raises(RecordError, match="unknown key 'bogus'"):
        append_manifest(camp, [WRITTEN[2], {**line, "bogus": 1}])  # type: ignore[list-item, typeddict-unknown-key]
    raw = camp.manifest.read_bytes().splitlines()
    assert len(raw) == 3 and all(r.startswith(b'{"type": "') for r in raw)
    lines, problems = read_manifest(camp)
    assert problems == [] and lines == [WRITTEN[0], WRITTEN[4], line]
    # a reader of a few kinds decodes those lines only
    assert read_manifest(camp, ("campaign", "repeats"))[0] == [WRITTEN[0]]
    assert read_manifest(CampaignPaths(tmp_path / "none")) == ([], [])


def test_reading_a_campaign_of_ten_thousand_runs_costs_about_what_decoding_it_does() -> None:
    from harness.contract.jsonfile import decode_jsonl

    lines = [WRITTEN[0]]
    for i in range(10_000):
        pid = f"{i:016x}"
        lines += [{**WRITTEN[4], "point_id": pid}, {**WRITTEN[6], "point_id": pid, "job_dir": f"/abs/{pid}.r0.a1"}]
    text = _text(lines)

    def best(fn) -> float:
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    decode = best(lambda: decode_jsonl(text, "manifest.jsonl"))
    parse = best(lambda: parse_manifest(text, "manifest.jsonl"))
    assert len(parse_manifest(text, "manifest.jsonl")[0]) == len(lines)
    # (what this guards is the order of growth: reading that went quadratic would take seconds here; a loaded
    # machine stretches one timing against the other by far less than 4x)
    assert parse < decode * 4 + 0.05, (parse, decode)
