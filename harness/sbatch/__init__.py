"""Turn JobSpecs into submissions: the local executor and SLURM job arrays, both through submitit."""
