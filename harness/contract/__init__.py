"""The facts every layer shares, and nothing else: the job directory's and the work dir's file names, run
ids (``paths``), what each scheduler state means (``jobstate``), the runner's settings and their defaults
(``defaults``), the errors the CLI turns into exit codes (``errors``), the formats of the files that pass
between layers (``formats``) and every ``SBENCH_*`` variable (``envvars``). It imports nothing of sbench.
"""
