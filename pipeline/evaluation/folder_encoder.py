"""A model folder loaded for evaluation: the one place ``jobs/evaluate.py``'s STS and retrieval
scorings load a model, pick its device and batch size, and encode an eval set's distinct texts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.evaluation.distinct_texts import DistinctTexts
from pipeline.model.accel import compute_device
from pipeline.model.encode import encode_batch_size, encode_rows, encode_texts
from pipeline.model.encoder import SentenceEncoder, load_sentence_encoder
from pipeline.model.folders import load_tokenizer, max_seq_len_of


@dataclass(frozen=True)
class FolderEncoder:
    """A sentence encoder read from a folder, on CPU or the first GPU, with the tokenizer and
    settings its eval sets are built with; embeddings come back raw (not unit-normalised), as
    the scorings and a whitening fitted on them expect."""

    model: SentenceEncoder
    tokenizer: Any
    device: torch.device
    batch_size: int
    """Sentences a batch."""
    max_seq_len: int
    """Tokens a text: the caller's, else the folder's own (:func:`~pipeline.model.folders.max_seq_len_of`)."""

    @classmethod
    def load(
        cls, model_dir: str | Path, *, batch_size: int | None = None, max_seq_len: int | None = None
    ) -> FolderEncoder:
        """``model_dir`` loaded on the first GPU where there is one, ``batch_size`` sentences a
        batch (``None``: :func:`~pipeline.model.encode.encode_batch_size` of the device)."""
        device = compute_device(use_gpu=True)
        return cls(
            model=load_sentence_encoder(model_dir).to(device),
            tokenizer=load_tokenizer(model_dir),
            device=device,
            batch_size=batch_size or encode_batch_size(device),
            max_seq_len=max_seq_len or max_seq_len_of(model_dir),
        )

    def encode_distinct(self, texts: DistinctTexts) -> np.ndarray:
        """``(texts.num_sentences, dim)`` float32: row ``i`` for the eval set's ``i``-th distinct text."""
        return encode_rows(
            self.model,
            texts.corpus(),
            np.arange(texts.num_sentences),
            batch_size=self.batch_size,
            device=self.device,
            normalize=False,
        )

    def encode_texts(self, texts: list[str]) -> np.ndarray:
        """``(len(texts), dim)`` float32: row ``i`` for ``texts[i]``, truncated to ``max_seq_len``."""
        return encode_texts(
            self.model,
            self.tokenizer,
            texts,
            max_seq_len=self.max_seq_len,
            batch_size=self.batch_size,
            device=self.device,
            normalize=False,
        )
