"""The sentence encoder: a Hugging Face encoder, a pooler, SimCSE's optional MLP head and its
optional MLM head (both used in training only)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import AutoConfig, AutoModel

from pipeline.model.mlm_head import MaskedLanguageHead

POOLING_FILE = "simcse_pooling.json"
POOLERS = ("cls", "cls_before_pooler", "mean")
MLM_ROW_BUCKET = 256
"""The MLM head scores masked positions in multiples of this many rows (see :meth:`SentenceEncoder.forward`)."""


class SentenceEncoder(nn.Module):
    """A Hugging Face encoder with SimCSE pooling.

    ``cls`` and ``cls_before_pooler`` take the first token's last hidden state; ``mean``
    averages the non-padding tokens. With ``use_mlp`` a dense+tanh head (SimCSE's MLP) is
    applied on top during training only: :meth:`forward` with ``train_head=False`` (used
    for evaluation, mining and export) never applies it. With ``use_mlm`` a
    :class:`~pipeline.model.mlm_head.MaskedLanguageHead` predicts masked tokens for SimCSE's
    auxiliary objective (``train.mlm_weight``), through the same :meth:`forward` so that DDP
    sees one forward pass.
    """

    mini_batch_size: int = 0
    """A training forward pass over more texts than this runs in pieces of this many
    (``train.mini_batch_size``; 0: in one): see :meth:`_pooled_in_pieces`."""

    def __init__(self, encoder: nn.Module, pooler: str, use_mlp: bool, use_mlm: bool = False):
        super().__init__()
        if pooler not in POOLERS:
            raise ValueError(f"model.pooler must be one of {', '.join(POOLERS)} (got {pooler!r})")
        self.encoder = encoder
        self.pooler = pooler
        hidden = encoder.config.hidden_size
        self.mlp = nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh()) if use_mlp else None
        self.mlm_head = (
            MaskedLanguageHead(
                encoder.get_input_embeddings(), getattr(encoder.config, "layer_norm_eps", 1e-12)
            )
            if use_mlm
            else None
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        train_head: bool = True,
        masked: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Embeddings of shape ``(batch, hidden)``.

        With ``masked`` = ``(masked_ids, positions)`` (the masked copy of ``input_ids`` and, as
        bool of the same shape, where it was masked), also the MLM head's scores there, from a
        second encoder pass over the masked copy (as the SimCSE reference computes them):
        ``(embeddings, scores)``, ``scores`` ``(rows, vocab)`` whose first ``positions.sum()``
        rows are the masked positions in order, the rest padding up to a multiple of
        :data:`MLM_ROW_BUCKET`.
        """
        embeddings = self._pooled_in_pieces(input_ids, attention_mask, train_head)
        if masked is None:
            return embeddings
        if self.mlm_head is None:
            raise ValueError("masked tokens given to an encoder built without an MLM head")
        masked_ids, positions = masked
        states = self.encoder(input_ids=masked_ids, attention_mask=attention_mask).last_hidden_state
        # Scores at the masked positions only: (b, width, vocab) would be ~0.5 GB a batch of 128.
        selected = states[positions]
        # In buckets of rows: a (rows x vocab) buffer of a new size every step fragmented the CPU
        # heap (+0.9 GB RSS over 300 steps of a 30k vocabulary, then flat); a few recurring sizes
        # are reused.
        pad = -len(selected) % MLM_ROW_BUCKET
        return embeddings, self.mlm_head(torch.nn.functional.pad(selected, (0, 0, 0, pad)))

    def _pooled_in_pieces(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, train_head: bool
    ) -> torch.Tensor:
        """:meth:`_pooled`, in pieces of :attr:`mini_batch_size` texts in a training pass
        (grad enabled): each piece keeps only its inputs and its embeddings, and is
        run again in the backward pass to rebuild its activations, with the dropout masks of its
        first run (torch's checkpoint replays the random state). The gradient is the one pass's;
        what it costs is one more forward pass, and activations are held one piece at a time, as
        sentence-transformers' cached losses and GradCache hold them, whatever the batch and the
        number of negatives. Inside the module's own forward, so that DDP sees one pass and
        each parameter's gradient is accumulated once (non-reentrant checkpointing)."""
        pieces = self.mini_batch_size
        # A pass no longer than a piece is checkpointed too: the step's other pass (anchors
        # beside positives and negatives) must not hold its activations meanwhile.
        if not (pieces and self.training and torch.is_grad_enabled()):
            return self._pooled(input_ids, attention_mask, train_head)
        return torch.cat([
            checkpoint(self._pooled, ids, mask, train_head, use_reentrant=False)
            for ids, mask in zip(input_ids.split(pieces), attention_mask.split(pieces), strict=True)
        ])  # fmt: skip

    def _pooled(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, train_head: bool
    ) -> torch.Tensor:
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        if self.pooler == "mean":
            weights = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)
        else:
            pooled = hidden[:, 0]
        if train_head and self.mlp is not None:
            pooled = self.mlp(pooled)
        return pooled


def load_encoder(model_dir: str | Path, dropout: float | None = None) -> nn.Module:
    """``AutoModel`` from a local folder, with dropout set and the HF pooler frozen.

    SimCSE pooling never uses the HF pooler layer. Trainable but unused, its parameters
    would get no gradient, which DDP treats as an error; removed, the saved model would
    lack them and every later load would warn about newly initialised weights. Frozen, it
    is skipped by DDP and saved unchanged.
    """
    config = AutoConfig.from_pretrained(model_dir)
    if dropout is not None:
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "dropout", "attention_dropout"):
            if hasattr(config, name):
                setattr(config, name, dropout)
    encoder = AutoModel.from_pretrained(model_dir, config=config)
    if getattr(encoder, "pooler", None) is not None:
        encoder.pooler.requires_grad_(False)
    return encoder


def load_sentence_encoder(
    model_dir: str | Path,
    pooler: str | None = None,
    use_mlp: bool = False,
    dropout: float | None = None,
    use_mlm: bool = False,
) -> SentenceEncoder:
    """A :class:`SentenceEncoder` from a model folder; the pooler defaults to the folder's own."""
    return SentenceEncoder(
        load_encoder(model_dir, dropout), pooler or folder_pooler(model_dir), use_mlp, use_mlm=use_mlm
    )


def declared_pooler(model_dir: str | Path) -> str | None:
    """The pooling a model folder declares: ours (an export of this pipeline), else its
    sentence-transformers Pooling module (``mean`` or ``cls``); ``None`` for a plain Hugging
    Face folder, which declares none."""
    model_dir = Path(model_dir)
    ours = model_dir / POOLING_FILE
    if ours.exists():
        return json.loads(ours.read_text())["pooler"]
    st_pooling = model_dir / "1_Pooling" / "config.json"
    if st_pooling.exists():
        config = json.loads(st_pooling.read_text())
        mode = config.get("pooling_mode")
        if mode == "mean" or config.get("pooling_mode_mean_tokens"):
            return "mean"
        if mode == "cls" or config.get("pooling_mode_cls_token"):
            return "cls"
        raise ValueError(f"{st_pooling}: only mean or cls pooling is supported (got {config})")
    return None


def folder_pooler(model_dir: str | Path) -> str:
    """The pooling to read a folder with when ``model.pooler`` is unset: the one it declares,
    else ``cls`` (a plain Hugging Face folder, as SimCSE's own models)."""
    return declared_pooler(model_dir) or "cls"


def pooler_warning(model_dir: str | Path, configured: str | None) -> str | None:
    """The job's one warning line where ``model.pooler`` is set and differs from what the
    folder declares (reading a sentence-transformers model with another pooling gives worse
    embeddings, silently); ``None`` otherwise."""
    declared = declared_pooler(model_dir)
    if configured is None or declared is None or configured == declared:
        return None
    return (
        f"[model] warning: model.pooler={configured}, but {model_dir} declares {declared} pooling; "
        f"using {configured} (unset model.pooler to read the folder its own way)"
    )


def cpu_state_dict(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()}
