"""SLURM: the one scheduler client (``client``) and the readers of what its commands answer."""
