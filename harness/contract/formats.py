"""What the files between the layers hold, where more than one layer writes or reads it.

- the stage names of ``stages.<host>.jsonl`` (the runner writes them; collect and the report read them);
- the columns of ``samples.<host>.csv`` with their SQL types and its row kinds (the runner's sampler writes
  them; the store loads them; older files hold a prefix of the columns);
- the dataset text field and the response template (datasets are generated with them, the training
  command line names them, the trainers split prompt from completion at the template).

docs/job-directory.md describes the job-dir files in full.
"""

from __future__ import annotations


class Stage:
    """The ``stage`` of a stage event."""

    # The node runner's (rank null), in its order; ``trial`` wraps each run of the training command of a
    # stability point.
    SETUP = "setup"
    TRIAL = "trial"
    TEARDOWN = "teardown"
    # Each rank's, in the sbench trainer's order (the fms-hf-tuning trainer loads the model before the
    # dataset and adds trainer_init between them and train). ``dataset`` is also the node runner's.
    LAUNCH = "launch"
    DATASET = "dataset"
    TOKENS = "tokens"
    MODEL_LOAD = "model_load"
    TRAINER_INIT = "trainer_init"
    TRAIN = "train"
    # The one stage of the sbench fabric workload's ranks.
    FABRIC = "fabric"
    # The one stage of the sbench preflight workload's ranks (a device's matmul and memory copy).
    PREFLIGHT = "preflight"


STAGES: tuple[str, ...] = (Stage.SETUP, Stage.LAUNCH, Stage.DATASET, Stage.TOKENS, Stage.MODEL_LOAD,
                           Stage.TRAINER_INIT, Stage.TRAIN, Stage.TEARDOWN, Stage.TRIAL, Stage.FABRIC,
                           Stage.PREFLIGHT)

# samples.<host>.csv: its columns in file order, each with the SQL type the store reads it as. ``kind`` is
# gpu (one row per device per tick), proc (one row per tick for the training process tree) or cpu (one row
# per CPU package per tick: its RAPL energy counter, CPU partitions only). ``energy_j``: the joules the
# device (GPU: NVML's total-energy counter; cpu: RAPL's package counter) used since the sampler's first
# reading of it, counter resets and wrap-arounds accounted; empty where the device has no readable counter.
# host (one row per tick: the host's CPU used by everything outside the run's own processes, the training
# process tree and the node runner, as cpu_pct = percent of the host's whole capacity over the sampler's
# period, 100 = every core busy with other work; from /proc/stat). ``foreign_procs`` (gpu rows): the processes
# on that GPU that are not the run's (NVML), empty where that cannot be told.
# A column is only ever added at the end: a file written before it has the header of a prefix of these
# (SAMPLE_CSV_OLDEST is the shortest), and its missing columns are read as empty.
SAMPLE_KINDS: tuple[str, ...] = ("gpu", "proc", "cpu", "host")
SAMPLE_CSV_COLUMNS: tuple[tuple[str, str], ...] = (
    ("t_wall", "DOUBLE"), ("t_mono", "DOUBLE"), ("kind", "VARCHAR"), ("device", "INTEGER"),
    ("gpu_util", "DOUBLE"), ("mem_used_mb", "DOUBLE"), ("mem_total_mb", "DOUBLE"),
    ("power_w", "DOUBLE"), ("power_limit_w", "DOUBLE"), ("cpu_pct", "DOUBLE"),
    ("mem_pct", "DOUBLE"), ("rss_mb", "DOUBLE"), ("nprocs", "INTEGER"), ("energy_j", "DOUBLE"),
    ("foreign_procs", "INTEGER"))
SAMPLE_CSV_NAMES: tuple[str, ...] = tuple(name for name, _ in SAMPLE_CSV_COLUMNS)
SAMPLE_CSV_OLDEST = 13  # the columns up to nprocs: the samples files written before energy_j


def sample_csv_names_of(header: str) -> tuple[str, ...]:
    """The columns a samples file holds, from its header line: the current ones, or those of an older file
    (a prefix of at least :data:`SAMPLE_CSV_OLDEST` columns). A header of any other shape: the current
    columns (the reader then skips the lines that do not fit them, each with its reason)."""
    names = tuple(h.strip() for h in header.rstrip("\r\n").split(","))
    if SAMPLE_CSV_OLDEST <= len(names) <= len(SAMPLE_CSV_NAMES) and names == SAMPLE_CSV_NAMES[:len(names)]:
        return names
    return SAMPLE_CSV_NAMES

# Datasets: the field (JSONL) or column (Parquet) holding each entry's text, and the line that starts the
# completion. On the command line the template is written with its newline escaped, as the reference
# writes it (harness.data.tokens.decode_template turns it back).
TEXT_FIELD = "output"
# Vision (image + text) datasets (Parquet): the column of each entry's images, and the column of its chat
# messages (OpenAI style: a user turn of {"type": "image"} items and a text item, an assistant turn), which
# both trainers render with the processor's chat template into the text the model sees.
IMAGE_FIELD = "images"
MESSAGES_FIELD = "messages"
RESPONSE_TEMPLATE = "\n### Response:"
RESPONSE_TEMPLATE_ARG = RESPONSE_TEMPLATE.replace("\n", "\\n")
