"""CLI: collect, query and report."""
