"""The HTML report (``page``, drawn from ``sections`` and ``charts`` over ``data``, which reads the database
through ``queries``) and ``sbench compare`` (``compare``)."""
