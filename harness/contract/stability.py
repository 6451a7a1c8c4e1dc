"""How stable a point's measurements are: the rating of a coefficient of variation (CV) across its repeats.

The bands are ado's: CV < 1 % ``excellent``, < 2 % ``good``, < 5 % ``moderate``, < 10 % ``fair``, else
``poor``. The CV is the sample standard deviation over the mean (``stddev_samp / avg``); it needs two
values, so a point with fewer valid repeats has no CV and no rating. The database's ``point_stability``
view rates with :func:`rating_sql`, ``status`` and the report show that rating, and Python code rates
with :func:`rating`: the bands live here only.
"""

from __future__ import annotations

# (upper bound, exclusive; rating), in order; a CV at or above the last bound is POOR.
BANDS: tuple[tuple[float, str], ...] = ((0.01, "excellent"), (0.02, "good"), (0.05, "moderate"), (0.10, "fair"))
POOR = "poor"
RATINGS: tuple[str, ...] = (*(name for _, name in BANDS), POOR)


def rating(cv: float | None) -> str | None:
    """The band of a coefficient of variation (a fraction: 0.01 = 1 %); None for None."""
    if cv is None:
        return None
    for bound, name in BANDS:
        if cv < bound:
            return name
    return POOR


def rating_sql(cv: str) -> str:
    """A SQL ``CASE`` expression rating the SQL expression *cv* the same way (NULL for NULL)."""
    whens = " ".join(f"WHEN {cv} < {bound!r} THEN '{name}'" for bound, name in BANDS)
    return f"CASE WHEN {cv} IS NULL THEN NULL {whens} ELSE '{POOR}' END"


def bands_text() -> str:
    """The bands in words: ``excellent (< 1 %), good (< 2 %), ... or poor``."""
    return ", ".join(f"{name} (< {100 * bound:g} %)" for bound, name in BANDS) + f" or {POOR}"
