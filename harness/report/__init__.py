"""The HTML report (``page``, drawn from ``sections`` and ``charts`` over ``data``, which reads the database
through ``harness.db.reportdata``) and ``sbench compare`` (``compare``)."""
