"""CLI: test models and synthetic datasets (sbench model ..., sbench dataset ...)."""
