"""CLI: the HTML report."""
