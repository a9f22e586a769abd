"""The ``model`` section: the pretrained encoder (or the tiny BERT of ``model.tiny``), its
pooling, SimCSE's MLP head and dropout."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pipeline.config.check import Check


@dataclass
class TinyModelSection:
    """Shape of the randomly initialised BERT built when ``model.name_or_path`` is unset: small
    enough that tests and the demo train in seconds on a CPU."""

    hidden_size: int = 64
    """Width of the embeddings, and so of the sentence vectors the index holds."""
    num_layers: int = 2
    """Transformer layers."""
    num_heads: int = 2
    """Attention heads per layer; must divide ``hidden_size``."""
    intermediate_size: int = 128
    """Width of each layer's feed-forward block."""
    vocab_size: int = 2000
    """Largest WordPiece vocabulary trained on the corpus (fewer when the corpus is small)."""


@dataclass
class ModelSection:
    name_or_path: str | None = None
    """HF hub name or model directory. ``None`` builds a tiny BERT and trains a WordPiece
    tokenizer on the corpus (no network needed)."""
    pooler: Literal["cls", "cls_before_pooler", "mean"] = "cls"
    mlp: bool | None = None
    """SimCSE's MLP head over the pooled output, used in training only. ``None``: on for ``cls``."""
    dropout: float = 0.1
    """Hidden and attention dropout: the only augmentation in unsupervised SimCSE."""
    tiny: TinyModelSection = field(default_factory=TinyModelSection)

    def checks(self) -> list[Check]:
        """This section's rules (see :data:`Check`)."""
        return [("model.dropout", 0 <= self.dropout < 1, "must be in [0, 1)")]
