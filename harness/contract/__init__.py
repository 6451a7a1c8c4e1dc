"""The facts every layer shares, and nothing else: the job directory's and the work dir's file names, run
ids (``paths``), what each scheduler state means (``jobstate``), the runner's settings and their defaults
(``defaults``), the errors the CLI turns into exit codes (``errors``), the formats of the files that pass
between layers (``formats``), every ``SBENCH_*`` variable (``envvars``) and the statistics every layer uses
(``stats``: Student's t, a mean's interval, Welch's test). It imports nothing of sbench.
"""
