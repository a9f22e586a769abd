"""Device speed settings, in one place for the train loop, encoding and ``bench/gpu_step.py``.

On CUDA: bf16 autocast, TF32 for the matmuls autocast leaves in fp32, and host batches
copied from pinned memory (asynchronously). On a CPU every function here is the plain fp32
path, so the same code runs (and is tested) everywhere. :func:`fused_adamw` is the optimizer
of both; ``train.compile`` compiles the model in the train loop.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import torch


def enable_tf32(device: torch.device) -> None:
    """TF32 tensor-core matmuls for fp32 work on CUDA (the loss' similarity matrix, the MLP head).

    Only the train workers call this: the miner's exact k-NN search ranks by fp32 scores,
    where TF32's 10-bit mantissa could reorder near ties."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def autocast(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """bf16 autocast on CUDA; on a CPU a no-op (CPU bf16 is slower than fp32 on most CPUs)."""
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")


def to_device(array: np.ndarray | torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host array on ``device``. On CUDA the copy goes through pinned memory, so it is
    asynchronous (a ``non_blocking`` copy from pageable memory is synchronous)."""
    tensor = torch.from_numpy(np.ascontiguousarray(array)) if isinstance(array, np.ndarray) else array
    if device.type != "cuda":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)


def fused_adamw(model: torch.nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW over ``model``'s trainable parameters, weight decay on matrices only (not biases or
    LayerNorm weights), as BERT fine-tuning does.

    Fused (one kernel per parameter group instead of a loop of small ops) on CUDA and CPU:
    55-63 ms -> 14 ms a step for MiniLM on 2 CPU cores (``bench/train_throughput.py`` notes).
    """
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if param.ndim < 2 or "LayerNorm" in name or "layer_norm" in name else decay).append(param)
    device = next(model.parameters()).device
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        fused=device.type in ("cuda", "cpu"),
    )
