"""One attempt's files, computed once and returned as text: its :class:`~harness.build.jobspec.JobSpec`
(resources, environment, launch command, accelerate and DeepSpeed configs), its training command line
(``trainargs``), its sbatch script (``sbatch``, the one maker of every sbatch script) and the rest of the
job directory (``render``). Pure: nothing here asks the scheduler, and only ``render.write_files`` writes.
"""
