"""The device speed path (pipeline.accel, train.compile) on a CPU: the same numbers as the
plain path, and a compiled model that saves and loads like an eager one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.accel import autocast, enable_tf32, to_device
from pipeline.model import load_encoder, load_sentence_encoder, load_tokenizer, save_model_dir


def _batch(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, 500, size=(6, 12))
    mask = (np.arange(12)[None, :] < rng.integers(3, 13, size=6)[:, None]).astype(np.int64)
    return ids * mask, mask


def test_cpu_path_is_plain_fp32():
    cpu = torch.device("cpu")
    enable_tf32(cpu)  # a no-op here
    array = np.arange(12).reshape(3, 4)[:, ::2]  # not contiguous
    tensor = to_device(array, cpu)
    assert tensor.device == cpu and np.array_equal(tensor.numpy(), array)
    with autocast(cpu):
        product = torch.ones(2, 3) @ torch.ones(3, 2)
    assert product.dtype == torch.float32


@pytest.mark.slow
def test_compiled_model_matches_eager_and_saves_unchanged(tmp_path, tiny_model_dir):
    eager = load_sentence_encoder(tiny_model_dir, pooler="mean", use_mlp=True).eval()
    compiled = load_sentence_encoder(tiny_model_dir, pooler="mean", use_mlp=True).eval()
    compiled.mlp.load_state_dict(eager.mlp.state_dict())
    keys = list(compiled.state_dict())
    compiled.compile()
    ids, mask = (torch.from_numpy(a) for a in _batch())
    with torch.no_grad():
        expected = eager(ids, mask)
        got = compiled(ids, mask)
    assert torch.allclose(got, expected, atol=1e-5), (got - expected).abs().max()
    # Compiled in place, the module keeps its parameter names: checkpoints and export load as usual.
    assert list(compiled.state_dict()) == keys
    folder = save_model_dir(compiled, load_tokenizer(tiny_model_dir), tmp_path / "saved", 32)
    reloaded = load_sentence_encoder(folder, pooler="mean").eval()
    with torch.no_grad():
        assert torch.allclose(
            reloaded(ids, mask, train_head=False), eager(ids, mask, train_head=False), atol=1e-5
        )


def test_encoders_load_with_sdpa_attention(tiny_model_dir):
    # transformers picks PyTorch's fused scaled-dot-product attention where the architecture
    # has it; the eager fallback would materialise every attention matrix.
    assert load_encoder(tiny_model_dir).config._attn_implementation == "sdpa"
