"""Matplotlib for the plots a run logs (review plots, similarity histograms): one headless
pyplot, loaded on first use."""

from __future__ import annotations

from typing import Any


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (no display: drivers, Ray workers, CI)."""
    # Deferred: pyplot takes seconds to import and is needed only when a plot is drawn, and
    # choosing the backend at import would change it for every process that imports us.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
