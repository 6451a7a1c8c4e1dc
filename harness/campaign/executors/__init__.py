"""Where a campaign's jobs run, behind one interface (``base.Backend``): the local queue (``local``) and SLURM
(``slurm``, with its packs and its feeder job), chosen by name in ``registry``."""
