"""The in-job runner: one node runner per node, one training process per device.

- :mod:`harness.runner.node`: ``python -m harness.runner node --job-dir D --host H -- CMD...``
  (stages, environment capture, the sampler, the training command, ``result.<host>.json``).
- :mod:`harness.runner.train`: ``python -m harness.runner.train <reference flags>`` (trl's
  SFTTrainer; ``rank.<rank>.json``, ``error.<rank>.json``, ``log_history.json``).

Every file they write is described in ``docs/job-directory.md`` and named by
:class:`harness.paths.JobPaths`.
"""
