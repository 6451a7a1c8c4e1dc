"""The tests' kit: everything a test or a bench shares, by topic. ``tests/conftest.py`` holds only fixtures and
hooks, and imports what they need from here.

Imported from ``tests.kit`` itself (the everyday names):

- :mod:`.paths`: ``ROOT`` (the checkout), ``FIXTURES``, ``TEST_INVENTORY`` and ``CLUSTER_SCRIPT`` (the test SLURM
  cluster's inventory and script).
- :mod:`.builders`: ``sweep(**over)`` and ``inventory(**over)``, small valid documents (the tiny model on this
  machine) to change a key of; ``write_yaml``, the one writer of a YAML input; ``SMALL_DATASET``, ``FULL`` and
  ``LORA``; the hostile-input tests' ``LAB_INVENTORY``, ``LAB_SWEEP`` and ``setin``.
- :mod:`.cli`: ``sbench(*args)``, the one way to run the CLI (a process of its own; ``in_process=True`` for
  click's runner; the ``cli`` fixture is the latter), and ``command(*args)``, its argv.
- :mod:`.sql`: ``sql_rows``, ``rows_of``, ``one``, ``dump`` and ``table_contents``: a results database, read.
- :mod:`.campaigns`: ``Campaign`` (a work dir, database and campaign name, with its manifest and rows) and
  ``Trained`` (the session's trained campaigns, made by ``build_trained``).

Imported by module, each for the tests of its topic:

- :mod:`.jobdirs`: synthetic job directories (``make_run``, ``write_attempt``, ``FakeSlurm``, the file writers).
- :mod:`.report`: a synthetic batch-size scan collected for real (``build_campaign``, ``write_run``,
  ``collect_into``), as the report tests and ``bench/report_page.py`` read it; ``html_only``.
- :mod:`.browser`: headless Chromium over the DevTools protocol, for the report's browser checks.
- :mod:`.budget`: the import budget of the read commands, and a fresh interpreter that watches the imports.
- :mod:`.secrets`: secrets a test inventory carries, and where they must never be written.
- :mod:`.sysfs`: a node's InfiniBand / RoCE sysfs tree, for the probe tests.
- :mod:`.session`: what the test session builds once for all its workers, and the order its tests run in.
"""

from .builders import FULL, LAB_INVENTORY, LAB_SWEEP, LORA, SMALL_DATASET, inventory, setin, sweep, write_yaml
from .campaigns import TRAINED_CAMPAIGNS, TRAINED_PEAK_TFLOPS, TRAINED_PRICE, Campaign, Trained, build_trained
from .cli import command, sbench
from .paths import CLUSTER_SCRIPT, FIXTURES, ROOT, TEST_INVENTORY
from .sql import assert_same_rows, dump, one, rows_of, sql_rows, table_contents

__all__ = [
    "CLUSTER_SCRIPT", "FIXTURES", "FULL", "LAB_INVENTORY", "LAB_SWEEP", "LORA", "ROOT", "SMALL_DATASET",
    "TEST_INVENTORY", "TRAINED_CAMPAIGNS", "TRAINED_PEAK_TFLOPS", "TRAINED_PRICE", "Campaign", "Trained",
    "build_trained", "command", "assert_same_rows",
    "dump", "inventory", "one", "rows_of", "sbench", "setin", "sql_rows", "sweep", "table_contents", "write_yaml",
]
