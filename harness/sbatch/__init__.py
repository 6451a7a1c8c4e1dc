"""Campaigns: what to run (``submit``, with what the database already has from ``state``), handing job dirs
to an executor (``backends``: ``local``, or ``slurm`` arrays through the scheduler client), the campaign
manifest (``manifest``), the campaign lock (``lock``), status and cancel (``control``), ``--wait`` and its
summary (``wait``), and the jobs around a campaign: preparation (``prepare``), ``probe`` and ``fabric``."""
