"""The review histogram of cosine similarities, on what a collapsed model gives."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from pipeline.tracking.plots import similarity_histogram_png


@pytest.mark.parametrize(
    "similarities",
    [
        np.full(50, 1.0000001, dtype=np.float32),  # identical embeddings, float error past 1.0
        np.ones(50, dtype=np.float32),
        np.linspace(-0.2, 0.9, 50, dtype=np.float32),
    ],
    ids=["just past 1", "all 1", "spread"],
)
def test_histogram_is_written_whatever_the_similarities(tmp_path, similarities):
    path = tmp_path / "similarity.png"
    similarity_histogram_png({"random pairs": similarities, "mined": similarities[:10]}, "cosine", str(path))
    with Image.open(path) as image:
        assert image.format == "PNG" and image.size[0] > 100
