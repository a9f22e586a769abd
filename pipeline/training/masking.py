"""BERT's token masking for SimCSE's auxiliary MLM objective (``train.mlm_weight``).

Of each row's real tokens, special tokens excluded, ``probability`` (0.15) are chosen; of
those 80% become the mask token, 10% a random token and 10% stay, and the model must predict
the original at every chosen position: the scheme of BERT, of transformers'
``DataCollatorForLanguageModeling`` and of the SimCSE reference's ``mask_tokens``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

MLM_PROBABILITY = 0.15
"""Share of tokens masked: BERT's, and the SimCSE reference's ``mlm_probability`` default."""

IGNORED = -100
"""The label of a position with nothing to predict (PyTorch's ``ignore_index``)."""


@dataclass(frozen=True)
class MaskingSpec:
    """What masking needs from the tokenizer."""

    mask_token_id: int
    vocab_size: int
    """Random replacements are drawn from ``[0, vocab_size)`` (``len(tokenizer)``)."""
    special_ids: tuple[int, ...]
    """Never chosen (``tokenizer.all_special_ids``: [CLS], [SEP], padding...)."""
    probability: float = MLM_PROBABILITY

    @classmethod
    def of_tokenizer(cls, tokenizer: Any) -> MaskingSpec:
        """The spec of a Hugging Face tokenizer; one without a mask token cannot do MLM."""
        if tokenizer.mask_token_id is None:
            raise ValueError("train.mlm_weight needs a tokenizer with a mask token; this one has none")
        return cls(
            int(tokenizer.mask_token_id), len(tokenizer), tuple(int(i) for i in tokenizer.all_special_ids)
        )


def mask_tokens(
    input_ids: np.ndarray, attention_mask: np.ndarray, spec: MaskingSpec, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """BERT-mask a padded batch.

    Args:
        input_ids: ``(n, width)`` token ids, right-padded.
        attention_mask: ``(n, width)``, 1 for real tokens.
        spec: the tokenizer's mask and special ids, and the share to mask.
        rng: random source (the epoch's augmentation generator).

    Returns:
        ``(masked_ids, labels)``, both ``(n, width)`` int64: the ids with the chosen positions
        replaced, and the original id at each chosen position, :data:`IGNORED` elsewhere.
    """
    ids = np.asarray(input_ids, dtype=np.int64)
    maskable = (np.asarray(attention_mask) > 0) & ~np.isin(ids, spec.special_ids)
    chosen = maskable & (rng.random(ids.shape) < spec.probability)
    labels = np.where(chosen, ids, IGNORED)
    roll = rng.random(ids.shape)
    masked = np.where(chosen & (roll < 0.8), spec.mask_token_id, ids)
    randomised = chosen & (roll >= 0.8) & (roll < 0.9)
    masked = np.where(randomised, rng.integers(0, spec.vocab_size, size=ids.shape), masked)
    return masked, labels
