"""What the files between the layers hold, where more than one layer writes or reads it.

- the stage names of ``stages.<host>.jsonl`` (the runner writes them; collect and the report read them);
- the columns of ``samples.<host>.csv`` with their SQL types (the runner's sampler writes them; the
  store loads them);
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


STAGES: tuple[str, ...] = (Stage.SETUP, Stage.LAUNCH, Stage.DATASET, Stage.TOKENS, Stage.MODEL_LOAD,
                           Stage.TRAINER_INIT, Stage.TRAIN, Stage.TEARDOWN, Stage.TRIAL, Stage.FABRIC)

# samples.<host>.csv: its columns in file order, each with the SQL type the store reads it as. ``kind`` is
# gpu (one row per device per tick) or proc (one row per tick for the training process tree).
SAMPLE_CSV_COLUMNS: tuple[tuple[str, str], ...] = (
    ("t_wall", "DOUBLE"), ("t_mono", "DOUBLE"), ("kind", "VARCHAR"), ("device", "INTEGER"),
    ("gpu_util", "DOUBLE"), ("mem_used_mb", "DOUBLE"), ("mem_total_mb", "DOUBLE"),
    ("power_w", "DOUBLE"), ("power_limit_w", "DOUBLE"), ("cpu_pct", "DOUBLE"),
    ("mem_pct", "DOUBLE"), ("rss_mb", "DOUBLE"), ("nprocs", "INTEGER"))
SAMPLE_CSV_NAMES: tuple[str, ...] = tuple(name for name, _ in SAMPLE_CSV_COLUMNS)

# Datasets: the field (JSONL) or column (Parquet) holding each entry's text, and the line that starts the
# completion. On the command line the template is written with its newline escaped, as the reference
# writes it (harness.data.tokens.decode_template turns it back).
TEXT_FIELD = "output"
RESPONSE_TEMPLATE = "\n### Response:"
RESPONSE_TEMPLATE_ARG = RESPONSE_TEMPLATE.replace("\n", "\\n")
