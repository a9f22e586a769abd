"""BERT-whitening (Su et al., 2021): an affine map that gives embeddings zero mean and
identity covariance, optionally keeping only the first k directions.

Fitted on corpus embeddings ``x`` (rows are sentences): ``mu = mean(x)``, ``cov = U Lambda U^T``,
``W = U Lambda^(-1/2)``, and ``whiten(x) = (x - mu) W[:, :k]``. In a model folder it is a
sentence-transformers ``Dense`` module (``2_Dense``, identity activation, weight ``W^T`` and bias
``-mu W``), so ``SentenceTransformer(path)`` applies it with no code of ours.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

DENSE_DIR = "2_Dense"
_IDENTITY = "torch.nn.modules.linear.Identity"


@dataclass
class Whitening:
    """``whiten(x) = x @ weight.T + bias``; ``weight`` is ``(k, dim)``, ``bias`` is ``(k,)``."""

    weight: np.ndarray
    bias: np.ndarray

    @property
    def out_dim(self) -> int:
        return int(self.weight.shape[0])

    def apply(self, x: np.ndarray) -> np.ndarray:
        """Whitened rows of ``x`` (``(n, dim)`` -> ``(n, k)``), float32."""
        return (np.asarray(x, dtype=np.float64) @ self.weight.T.astype(np.float64) + self.bias).astype(
            np.float32
        )


def fit_whitening(x: np.ndarray, dim: int | None = None, rcond: float = 1e-5) -> Whitening:
    """Fit whitening on ``x`` (``(n, d)`` raw, un-normalised embeddings).

    Args:
        dim: keep the first ``dim`` whitened directions (largest variance first); ``None``: all
            that carry variance.
        rcond: directions whose variance is below ``rcond`` x the largest are dropped, as a
            pseudo-inverse does. Mean-pooled outputs of a LayerNorm-ed encoder lie in a
            hyperplane, so one direction has no variance at all; scaled up to unit variance it
            would hold nothing but float rounding, amplified thousands of times.

    Raises:
        ValueError: fewer than two rows, or ``dim`` larger than the embedding size.
    """
    x = np.asarray(x, dtype=np.float64)
    n, d = x.shape
    k = d if dim is None else dim
    if n < 2:
        raise ValueError(f"whitening needs at least 2 embeddings (got {n})")
    if not 1 <= k <= d:
        raise ValueError(f"eval.whitening_dim must be in [1, {d}] for {d}-dimensional embeddings (got {k})")
    mu = x.mean(axis=0)
    cov = np.cov(x - mu, rowvar=False)
    u, s, _ = np.linalg.svd(cov)
    k = min(k, int(np.sum(s > rcond * s[0])))
    w = u[:, :k] / np.sqrt(s[:k])  # (d, k)
    return Whitening(weight=w.T.astype(np.float32), bias=(-mu @ w).astype(np.float32))


def save_whitening(whitening: Whitening, model_dir: str | Path) -> None:
    """Write the whitening as a sentence-transformers Dense module and list it in modules.json."""
    out = Path(model_dir)
    dense = out / DENSE_DIR
    dense.mkdir(parents=True, exist_ok=True)
    (dense / "config.json").write_text(
        json.dumps(
            {
                "in_features": int(whitening.weight.shape[1]),
                "out_features": whitening.out_dim,
                "bias": True,
                "activation_function": _IDENTITY,
            },
            indent=2,
        )
    )
    save_file(
        {
            "linear.weight": torch.from_numpy(np.ascontiguousarray(whitening.weight)),
            "linear.bias": torch.from_numpy(np.ascontiguousarray(whitening.bias)),
        },
        str(dense / "model.safetensors"),
    )
    modules_file = out / "modules.json"
    modules = json.loads(modules_file.read_text())
    modules = [m for m in modules if m.get("path") != DENSE_DIR]
    modules.append(
        {
            "idx": len(modules),
            "name": str(len(modules)),
            "path": DENSE_DIR,
            "type": "sentence_transformers.models.Dense",
        }
    )
    modules_file.write_text(json.dumps(modules, indent=2))


def load_whitening(model_dir: str | Path) -> Whitening | None:
    """The whitening saved in a model folder, or None when it has none."""
    dense = Path(model_dir) / DENSE_DIR
    if not (dense / "model.safetensors").exists():
        return None
    config = json.loads((dense / "config.json").read_text())
    if config.get("activation_function", _IDENTITY) != _IDENTITY:
        raise ValueError(f"{dense}: a Dense layer with an activation is not a whitening layer")
    tensors = load_file(str(dense / "model.safetensors"))
    return Whitening(tensors["linear.weight"].numpy(), tensors["linear.bias"].numpy())
