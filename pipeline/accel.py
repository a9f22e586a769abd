"""Device speed settings, in one place for the train loop, encoding and ``bench/gpu_step.py``.

On CUDA: bf16 autocast, TF32 for the matmuls autocast leaves in fp32, and host batches
copied from pinned memory (asynchronously). On a CPU every function here is the plain fp32
path, so the same code runs (and is tested) everywhere. Fused AdamW is chosen where the
optimizer is built (``fused=True`` needs CUDA tensors); ``train.compile`` compiles the
model in the train loop.
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
