"""The device speed path (pipeline.accel, train.compile) on a CPU: the same numbers as the
plain path, encoding in fp32 on every CPU (evaluation and mining alike), and a compiled model
that saves and loads like an eager one."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from pipeline.data.tokenized import TokenizedCorpus
from pipeline.model.accel import autocast, enable_tf32, encodes_bf16, fused_adamw, mining_dtype, to_device
from pipeline.model.encode import encode_rows
from pipeline.model.encoder import load_encoder, load_sentence_encoder
from pipeline.model.folders import load_tokenizer, save_model_dir


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


def test_encoding_is_fp32_on_every_cpu_and_bf16_on_a_gpu(tiny_model_dir):
    """Evaluation and mining share one encode: fp32 on a CPU, also one that computes bf16
    natively (there bf16 mining cost the refreshed arm's quality, docs/results.md); a GPU
    encodes under bf16 autocast."""
    cpu = torch.device("cpu")
    assert not encodes_bf16(cpu) and mining_dtype(cpu) == "fp32"
    assert encodes_bf16(torch.device("cuda")) and mining_dtype(torch.device("cuda")) == "bf16"
    model = load_sentence_encoder(tiny_model_dir, pooler="mean")
    ids, mask = _batch(1)
    unpadded = [row[: int(n)].tolist() for row, n in zip(ids, mask.sum(1), strict=True)]
    corpus = TokenizedCorpus(pa.table({"input_ids": unpadded}), pad_token_id=0)
    rows = np.arange(len(corpus))

    def reference(bf16: bool) -> np.ndarray:
        """All rows in one forward pass under an explicit autocast, L2-normalised."""
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            emb = model(*(torch.from_numpy(a) for a in corpus.batch(rows)), train_head=False)
        return torch.nn.functional.normalize(emb.float(), dim=-1).numpy()

    fp32, bf16 = reference(False), reference(True)
    # bf16 rounding moves these vectors by ~1e-5 (a random model's small layer outputs beside
    # its fp32 residual stream); the encode must sit ten times closer to the fp32 forward.
    tolerance = np.abs(fp32 - bf16).max() / 10
    assert tolerance > 1e-7
    np.testing.assert_allclose(
        encode_rows(model, corpus, rows, batch_size=len(rows), device=cpu), fp32, rtol=0, atol=tolerance
    )


def test_fused_adamw_decays_matrices_only_and_steps_like_the_loop_version(tiny_model_dir):
    model = load_sentence_encoder(tiny_model_dir, pooler="mean", use_mlp=True)
    model.encoder.embeddings.word_embeddings.weight.requires_grad_(False)  # frozen: left out
    optimizer = fused_adamw(model, lr=1e-3, weight_decay=0.01)
    decay, no_decay = optimizer.param_groups
    assert optimizer.defaults["fused"] and (decay["weight_decay"], no_decay["weight_decay"]) == (0.01, 0.0)
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(p.ndim == 2 and "LayerNorm" not in names[id(p)] for p in decay["params"])
    assert all(p.ndim == 1 or "LayerNorm" in names[id(p)] for p in no_decay["params"])
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert len(decay["params"]) + len(no_decay["params"]) == len(trainable)
    # One step next to torch's per-parameter loop on the same groups: the same weights.
    reference = load_sentence_encoder(tiny_model_dir, pooler="mean", use_mlp=True)
    reference.load_state_dict(model.state_dict())
    reference.encoder.embeddings.word_embeddings.weight.requires_grad_(False)
    by_name = dict(reference.named_parameters())
    loop = torch.optim.AdamW(
        [
            {"params": [by_name[names[id(p)]] for p in decay["params"]], "weight_decay": 0.01},
            {"params": [by_name[names[id(p)]] for p in no_decay["params"]], "weight_decay": 0.0},
        ],
        lr=1e-3,
        foreach=False,
    )
    ids, mask = (torch.from_numpy(a) for a in _batch())
    for net, opt in ((model, optimizer), (reference, loop)):
        torch.manual_seed(0)
        net(ids, mask).pow(2).sum().backward()
        opt.step()
    for name, param in model.named_parameters():
        torch.testing.assert_close(param, by_name[name], rtol=1e-5, atol=1e-6)


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
