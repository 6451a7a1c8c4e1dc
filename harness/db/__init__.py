"""The results database (DuckDB): the one package that holds SQL, one module per job.

- ``schema``: every table, view and type, and the schema version.
- ``store``: the connection: opening it (waiting while another process holds the write lock), creating or
  checking the schema, transactions, and the generic insert / upsert / delete every writer uses.
- ``values`` and ``staging``: Python values as the columns store them; rows as typed columns.
- writers and readers, one module per consumer: ``manifest`` (submit's records; collect's too),
  ``status`` (submit, status, cancel), ``runs``, ``samples`` and ``overlaps`` (collect: runs that held
  one host at the same time), ``checks`` (collect and
  ``sbench check``), ``cluster`` (probe and fabric).

Only login-node commands open the database: ``submit`` records campaigns, points and attempts,
``collect`` writes what the job directories and the scheduler say, ``probe`` and ``fabric`` their
measurements. Every write runs in a transaction; the runner on the compute nodes never imports this.
"""
