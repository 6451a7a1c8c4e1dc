"""Campaigns beyond one results database: ``sbench export`` (a campaign's rows as Parquet files with their
provenance), ``sbench import DIR`` (another database's export, under its cluster's namespace) and ``sbench
import --format ado-csv`` (the reference's published measurements as a campaign).

- ``export``: the files of an export (:mod:`harness.contract.exchange` names them), written deterministically.
- ``importer``: an export checked byte by byte, then written in one transaction.
- ``adocsv``: a published CSV's rows (:mod:`harness.spec.published`) as a campaign.
"""
