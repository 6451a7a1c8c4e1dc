"""The in-job runner: one node runner per node, one training process per device.

- :mod:`harness.runner.node`: ``python -m harness.runner node --job-dir D --host H -- CMD...``
  (stages, environment capture, the sampler, the training command, ``result.<host>.json``).
- :mod:`harness.runner.train`: ``python -m harness.runner.train <reference flags>`` (trl's
  SFTTrainer; ``rank.<rank>.json``, ``error.<rank>.json``, ``log_history.json``), and
  :mod:`harness.runner.fms`, the fms-hf-tuning trainer. Both share the command line
  (:mod:`~harness.runner.cmdline`), the rank's frame (:mod:`~harness.runner.rank`), the measurements
  (:mod:`~harness.runner.measure`) and the record of what ran (:mod:`~harness.runner.devices`).

Every file they write is described in ``docs/job-directory.md`` and named by
:class:`harness.contract.paths.JobPaths`.
"""

import time

# When this package started loading: in a rank, the end of the interpreter's own start-up (site, the
# environment's .pth files) and the start of sbench's imports, as the launch stage splits them.
LOADED_WALL = time.time()
