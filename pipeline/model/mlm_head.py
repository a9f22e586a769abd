"""The masked-language-model head of SimCSE's auxiliary objective (``train.mlm_weight``)."""

from __future__ import annotations

import torch
from torch import nn


class MaskedLanguageHead(nn.Module):
    """BERT's prediction head: dense, GELU, LayerNorm, then scores over the vocabulary.

    Its decoder shares the encoder's input word embeddings (BERT's tied output embeddings),
    with a bias of its own, so the head adds ``hidden^2 + 3 x hidden + vocab`` parameters
    instead of a second ``vocab x hidden`` matrix. The rest starts random, as the SimCSE
    reference's ``lm_head`` does. Used in training only: exports and checkpoints' model
    folders leave it out (a checkpoint keeps it beside the optimizer).
    """

    def __init__(self, word_embeddings: nn.Embedding, layer_norm_eps: float = 1e-12):
        super().__init__()
        vocab, hidden = word_embeddings.weight.shape
        self.dense = nn.Linear(hidden, hidden)
        self.act = nn.GELU()
        self.layer_norm = nn.LayerNorm(hidden, eps=layer_norm_eps)
        self.word_embeddings = word_embeddings  # shared with the encoder, not a copy
        self.bias = nn.Parameter(torch.zeros(vocab))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``(..., hidden)`` last hidden states to ``(..., vocab)`` token scores."""
        transformed = self.layer_norm(self.act(self.dense(hidden)))
        return nn.functional.linear(transformed, self.word_embeddings.weight, self.bias)

    def own_state_dict(self) -> dict[str, torch.Tensor]:
        """The head's own weights, without the shared embeddings (the encoder saves those)."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("word_embeddings.")}

    def load_own_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Load what :meth:`own_state_dict` saved."""
        missing, unexpected = self.load_state_dict(state, strict=False)
        if unexpected or [k for k in missing if not k.startswith("word_embeddings.")]:
            raise ValueError(f"MLM head state does not match: missing {missing}, unexpected {unexpected}")
