"""CLI: submit, status, cancel and retry."""
