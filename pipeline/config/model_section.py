"""The ``model`` section: the pretrained encoder (or a tiny random BERT), its pooling,
SimCSE's MLP head and dropout."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pipeline.config.check import Check

TINY_RANDOM_BERT = "a tiny BERT (random weights)"
"""What a run fine-tunes without ``model.name_or_path``, as params, descriptions and tags name it."""


@dataclass
class ModelSection:
    name_or_path: str | None = None
    """HF hub name or model directory. ``None`` builds a tiny random BERT of one fixed shape
    (``pipeline.model.tiny.TINY_BERT``) and trains a WordPiece tokenizer on the corpus (no
    network needed)."""
    pooler: Literal["cls", "cls_before_pooler", "mean"] | None = None
    """``None``: what the model folder declares (this pipeline's export, or a
    sentence-transformers ``1_Pooling`` config: all-MiniLM-L6-v2 says ``mean``), else ``cls``.
    Set, it wins, with one warning line where the folder declares another."""
    mlp: bool | None = None
    """SimCSE's MLP head over the pooled output, used in training only. ``None``: on for
    ``cls`` pooling (as configured or as the folder declares)."""
    dropout: float = 0.1
    """Hidden and attention dropout: the only augmentation in unsupervised SimCSE."""

    def checks(self) -> list[Check]:
        """This section's rules (see :data:`Check`)."""
        return [("model.dropout", 0 <= self.dropout < 1, "must be in [0, 1)")]
