"""MFU's FLOP count against torch's own FLOP counter, and the counting wrapper the train loop calls."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import BertConfig, BertModel

from pipeline.model.encoder import SentenceEncoder
from pipeline.model.flops import CountingEncoder, EncoderFlops, datasheet_peak_tflops, device_peak_tflops


def _encoder(hidden: int = 64, layers: int = 2, intermediate: int = 256) -> SentenceEncoder:
    config = BertConfig(
        vocab_size=500,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=intermediate,
        max_position_embeddings=128,
        # Eager attention: explicit matmuls, which FlopCounterMode counts on a CPU.
        attn_implementation="eager",
    )
    return SentenceEncoder(BertModel(config, add_pooling_layer=False), pooler="mean", use_mlp=False)


@pytest.mark.parametrize("width", [16, 64])
def test_training_flops_match_torch_flop_counter(width):
    torch.manual_seed(0)
    model = _encoder()
    ids = torch.randint(5, 500, (8, width))
    mask = torch.ones_like(ids)  # no padding: torch counts padded positions as work too
    with FlopCounterMode(display=False) as counter:
        model(ids, mask).pow(2).sum().backward()
    expected = counter.get_total_flops()
    counted = EncoderFlops.of(model).training_flops(tokens=ids.numel(), width=width)
    # What remains is the bias and LayerNorm parameters inside 6N (no matmul work), under 2%.
    assert counted == pytest.approx(expected, rel=0.02)
    assert counted > expected


def test_embedding_tables_are_not_counted():
    model = _encoder()
    flops = EncoderFlops.of(model)
    tables = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Embedding))
    assert flops.non_embedding_params == sum(p.numel() for p in model.parameters()) - tables
    assert (flops.layers, flops.hidden) == (2, 64)


def test_counting_encoder_counts_real_tokens_of_every_call_and_resets():
    model = _encoder().eval()  # no dropout: the wrapped and the plain call give one answer
    counted = CountingEncoder(model, EncoderFlops.of(model))
    ids = torch.randint(5, 500, (4, 10))
    mask = torch.tensor([[1] * 10, [1] * 7 + [0] * 3, [1] * 3 + [0] * 7, [1] * 10])
    out = counted(ids, mask)
    assert torch.equal(out, model(ids, mask))  # a pass-through
    counted(ids[:2, :6], mask[:2, :6])
    tokens, flops = counted.take()
    assert tokens == 30 + 12
    assert flops == pytest.approx(
        EncoderFlops.of(model).training_flops(30, 10) + EncoderFlops.of(model).training_flops(12, 6)
    )
    assert counted.take() == (0, 0.0)


def test_peak_comes_from_the_datasheet_of_a_known_device():
    assert datasheet_peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert datasheet_peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert datasheet_peak_tflops("NVIDIA H200") == 989.0
    assert datasheet_peak_tflops("NVIDIA A10G") is None
    assert device_peak_tflops(torch.device("cpu")) is None
