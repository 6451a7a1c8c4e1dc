"""SLURM: the one scheduler client (``client``) and the readers of what its commands answer; and the local
executor's word on its jobs (``localjob``: which process is whose, and each job's state)."""
