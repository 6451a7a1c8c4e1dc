"""Campaigns: what to run (``submit``, with what the database already has from ``state``), handing job dirs
to an executor (``backends``: ``local``, or ``slurm`` arrays through the scheduler client), the campaign
manifest (``manifest``), status and cancel (``control``), and the jobs around a campaign: preparation
(``prepare``), ``probe`` and ``fabric``."""
