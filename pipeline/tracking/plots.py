"""Matplotlib for the plots a run logs (review plots, similarity histograms): one headless
pyplot, loaded on first use."""

from __future__ import annotations

from typing import Any

import numpy as np


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (no display: drivers, Ray workers, CI)."""
    # Deferred: pyplot takes seconds to import and is needed only when a plot is drawn, and
    # choosing the backend at import would change it for every process that imports us.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def similarity_histogram_png(
    series: dict[str, np.ndarray], xlabel: str, path: str, *, cosine: bool = True
) -> None:
    """Overlaid density histograms of cosine similarities, one per ``label: values`` (e.g.
    random pairs vs mined negatives), written to ``path`` as a PNG; ``cosine`` False: scores on
    any scale (a cross-encoder's logits), binned over their own range."""
    plt = pyplot()
    if cosine:
        # Float error puts a cosine of identical embeddings just past 1.0, and a collapsed model
        # (or a corpus its vocabulary does not cover) has nothing else: the bins must still rise.
        clipped = {label: np.clip(values, -1.0, 1.0) for label, values in series.items()}
        low, high = min(min(float(v.min()) for v in clipped.values()), 0.99), 1.0
    else:
        clipped = series
        low, high = min(float(v.min()) for v in series.values()), max(float(v.max()) for v in series.values())
        high = max(high, low + 1e-6)
    bins = np.linspace(low, high, 60)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for label, values in clipped.items():
        ax.hist(values, bins=bins, alpha=0.55, density=True, label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("density")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
