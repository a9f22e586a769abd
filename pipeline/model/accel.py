"""Device speed settings, in one place for the train loop, encoding and ``bench/gpu_step.py``.

On CUDA: bf16 autocast, TF32 for the matmuls autocast leaves in fp32, and host batches
copied from pinned memory (asynchronously). On a CPU the plain fp32 path, except that the
train steps use bf16 autocast on a CPU that computes bf16 natively (:func:`native_bf16`);
encoding (evaluation and mining) stays fp32 there (:func:`encodes_bf16`). The same code runs
(and is tested) everywhere. :func:`fused_adamw` is the optimizer of both; ``train.compile``
compiles the model in the train loop.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import torch


def compute_device(*, use_gpu: bool) -> torch.device:
    """Where a process computes: CUDA when ``use_gpu`` and this process sees a GPU (Ray sets
    ``CUDA_VISIBLE_DEVICES`` to those it reserved), else the CPU. The offline jobs run in the
    driver, so a GPU setting there means the driver's machine's GPU, if it has one."""
    return torch.device("cuda" if use_gpu and torch.cuda.is_available() else "cpu")


def enable_tf32(device: torch.device) -> None:
    """TF32 tensor-core matmuls for fp32 work on CUDA (the loss' similarity matrix, the MLP head).

    Only the train workers call this: the miner's exact k-NN search ranks by fp32 scores,
    where TF32's 10-bit mantissa could reorder near ties."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` computes bf16 natively: a CUDA GPU, or a CPU with AVX512-BF16 or AMX
    (recent Xeon and EPYC). Elsewhere bf16 is emulated, slower than fp32."""
    if device.type == "cuda":
        return True
    return device.type == "cpu" and (
        torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    )


def encodes_bf16(device: torch.device) -> bool:
    """Whether encoding (evaluation and mining) on ``device`` runs under bf16 autocast: on CUDA;
    on a CPU never, even one that computes bf16 natively.

    Measured on 2 cores with AVX512-BF16 (docs/results.md, "Mining in bf16"): mining under bf16
    autocast encoded the Twitter URL recipe's texts 1.79x faster, and the recipe (mined once)
    scored level over three seeds, but the refreshed arm scored lower on dev-distractors at
    every seed (82.30 +- 0.14 against 82.63 +- 0.17 nDCG@10 with fp32 mining), so a CPU mines in
    fp32. Evaluation in fp32 keeps reported scores comparable across CPUs and with the offline
    evaluate job."""
    return device.type == "cuda"


def mining_dtype(device: torch.device) -> str:
    """``bf16`` or ``fp32``: what mining encodes in on ``device`` (:func:`encodes_bf16`), as the
    ``simcse.mining_dtype`` tag records it."""
    return "bf16" if encodes_bf16(device) else "fp32"


def autocast(device: torch.device, bf16: bool | None = None) -> contextlib.AbstractContextManager[Any]:
    """Encoding's autocast: bf16 where ``bf16``, by default where :func:`encodes_bf16`."""
    enabled = encodes_bf16(device) if bf16 is None else bf16
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=enabled)


def train_autocast(device: torch.device, bf16: bool | None = None) -> contextlib.AbstractContextManager[Any]:
    """The train steps' autocast: bf16 where ``bf16``, by default wherever the device computes
    bf16 natively (:func:`native_bf16`). Weights, gradients and the loss stay fp32. On 2 cores
    of a CPU with AVX512-BF16 a MiniLM step ran 1.5-1.7x faster, at the same dev scores
    (docs/benchmarks.md: Twitter URL with bf16 forward passes on the CPU)."""
    enabled = native_bf16(device) if bf16 is None else bf16
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=enabled)


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
