"""Model FLOPs of training steps, for MFU (model FLOPs utilisation: achieved / peak FLOP/s).

The count is PaLM's (Chowdhery et al. 2022, appendix B): a token costs 6 FLOPs per
non-embedding parameter in a training step (2 forward, 4 backward) plus
``12 x layers x hidden x width`` for the attention scores and their weighted sum over a
sequence of ``width`` positions. Only real tokens count: the device also computes the padding,
but that is work the model does not need, so padding shows as lower MFU. Embedding lookups do
no matrix work and are left out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn


def non_embedding_params(model: nn.Module) -> int:
    """Parameters outside ``nn.Embedding`` tables (word, position and token-type lookups)."""
    tables = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    return sum(p.numel() for p in model.parameters() if id(p) not in tables)


@dataclass(frozen=True)
class EncoderFlops:
    """The FLOP cost of one encoder's training tokens."""

    non_embedding_params: int
    layers: int
    """Transformer layers (0 when the architecture's config does not say: no attention term)."""
    hidden: int

    @classmethod
    def of(cls, model: nn.Module) -> EncoderFlops:
        """From a :class:`~pipeline.model.encoder.SentenceEncoder` (or any module with a
        Hugging Face ``config`` on it or on its ``encoder``)."""
        config = getattr(model, "config", None) or getattr(getattr(model, "encoder", None), "config", None)
        layers = getattr(config, "num_hidden_layers", 0) or 0
        hidden = getattr(config, "hidden_size", 0) or 0
        return cls(non_embedding_params(model), int(layers), int(hidden))

    def training_flops(self, tokens: float, width: int) -> float:
        """FLOPs of a forward and backward pass over ``tokens`` real tokens in sequences
        padded to ``width``."""
        return tokens * (6.0 * self.non_embedding_params + 12.0 * self.layers * self.hidden * width)


def datasheet_peak_tflops(device_name: str) -> float | None:
    """Dense bf16 tensor-core peak of an H100/H200 from NVIDIA's datasheets (their headline
    figures assume 2:4 sparsity, twice these); None for other devices."""
    if "H100" not in device_name and "H200" not in device_name:
        return None
    if "PCIe" in device_name:
        return 756.0
    if "NVL" in device_name:
        return 835.0
    return 989.0


def device_peak_tflops(device: torch.device) -> float | None:
    """The peak MFU is measured against: the datasheet figure of a CUDA device this module
    knows, else None (no MFU)."""
    if device.type != "cuda":
        return None
    return datasheet_peak_tflops(torch.cuda.get_device_name(device))


@dataclass
class CountingEncoder:
    """The model as a train step calls it, ``model(input_ids, attention_mask)``, counting the
    real tokens and model FLOPs of every call.

    A plain callable around the model (the DDP wrapper or a compiled module alike), so the
    counting never enters DDP's or ``torch.compile``'s machinery. The token sums stay on the
    device until :meth:`take`, which the train loop calls after it has read the loss (a sync
    already), so counting adds no synchronisation.
    """

    model: Any
    flops: EncoderFlops
    _calls: list[tuple[torch.Tensor, int]] = field(default_factory=list)

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kwargs: Any) -> Any:
        """The model's output; ``masked`` (the MLM objective's copy) is a second encoder pass
        over as many tokens (its small prediction head is not counted)."""
        passes = 2 if kwargs.get("masked") is not None else 1
        for _ in range(passes):
            self._calls.append((attention_mask.sum(), int(attention_mask.shape[1])))
        return self.model(input_ids, attention_mask, **kwargs)

    def take(self) -> tuple[int, float]:
        """``(tokens, flops)`` of the calls since the last take."""
        tokens, flops = 0, 0.0
        for count, width in self._calls:
            n = int(count)
            tokens += n
            flops += self.flops.training_flops(n, width)
        self._calls.clear()
        return tokens, flops
