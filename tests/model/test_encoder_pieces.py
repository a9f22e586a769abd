"""``train.mini_batch_size``: a training pass run in pieces, each recomputed in the backward
pass (:meth:`pipeline.model.encoder.SentenceEncoder._pooled_in_pieces`).

What a user relies on: the gradient is the one a plain pass over the same pieces gives (dropout
masks included), the pass holds far fewer activations, and DDP averages it as it averages a
plain pass."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.config.loading import load_config
from pipeline.core.errors import ConfigError
from pipeline.model.encoder import load_sentence_encoder

ROWS, WIDTH, PIECE = 10, 12, 3


def _inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``ROWS`` right-padded texts of random lengths over the tiny vocabulary."""
    rng = np.random.default_rng(seed)
    ids = torch.from_numpy(rng.integers(5, 600, size=(ROWS, WIDTH)))
    lengths = rng.integers(3, WIDTH + 1, size=ROWS)
    mask = torch.from_numpy((np.arange(WIDTH)[None, :] < lengths[:, None]).astype(np.int64))
    return ids * mask, mask


def _loss(embeddings: torch.Tensor) -> torch.Tensor:
    # Rows interact (a softmax over the batch), so a piece's gradient depends on every other piece.
    sims = torch.nn.functional.normalize(embeddings, dim=-1) @ embeddings.T
    return torch.logsumexp(sims / 0.05, dim=1).mean() + embeddings.pow(2).mean()


def _gradients(model) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def test_pieces_give_the_gradient_of_a_plain_pass_over_the_same_pieces(tiny_model_dir):
    """The reference runs the same pieces one after another with plain autograd (every
    activation kept), from the same random state: the same dropout masks, so the same
    embeddings and gradient. Without the random state replayed in the backward pass, the
    recomputed pieces would draw new masks and the gradient would differ."""
    ids, mask = _inputs()
    model = load_sentence_encoder(tiny_model_dir, pooler="mean", dropout=0.1).train()

    torch.manual_seed(3)
    want_embeddings = torch.cat([
        model._pooled(i, m, True) for i, m in zip(ids.split(PIECE), mask.split(PIECE), strict=True)
    ])  # fmt: skip
    _loss(want_embeddings).backward()
    want = _gradients(model)
    model.zero_grad(set_to_none=True)

    model.mini_batch_size = PIECE
    torch.manual_seed(3)
    got_embeddings = model(ids, mask)
    _loss(got_embeddings).backward()
    got = _gradients(model)
    model.zero_grad(set_to_none=True)

    torch.testing.assert_close(got_embeddings, want_embeddings, rtol=0, atol=0)
    assert got.keys() == want.keys() and len(got) > 10
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-7, msg=name)

    # Dropout is on: another random state gives another gradient, which the check above tells apart.
    torch.manual_seed(4)
    _loss(model(ids, mask)).backward()
    other = _gradients(model)
    assert not torch.allclose(other["encoder.embeddings.word_embeddings.weight"],
                              want["encoder.embeddings.word_embeddings.weight"])  # fmt: skip


def _saved_bytes(model, ids: torch.Tensor, mask: torch.Tensor) -> int:
    """Bytes of the tensors autograd keeps for the backward pass of one training forward pass
    and the loss (a piece's own are kept by its checkpoint, which keeps only its inputs)."""
    saved = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        saved += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        _loss(model(ids, mask))
    return saved


def test_pieces_keep_a_fraction_of_the_activations(tiny_model_dir):
    """Measured, not timed: what autograd holds after the forward pass. In pieces it is the
    embeddings and the loss's inputs; in one pass every layer's activations. (Found by the
    bench: the anchors' pass, no longer than a piece, first kept its activations.)"""
    ids, mask = _inputs()
    model = load_sentence_encoder(tiny_model_dir, pooler="mean", dropout=0.1).train()
    whole = _saved_bytes(model, ids, mask)
    model.mini_batch_size = PIECE
    pieces = _saved_bytes(model, ids, mask)
    assert pieces * 10 < whole, (pieces, whole)
    # A pass that fits one piece keeps no activations either: a step's anchors, one piece,
    # must not hold theirs while its positives and negatives run.
    model.mini_batch_size = ROWS
    assert _saved_bytes(model, ids, mask) * 10 < whole


def test_no_pieces_where_no_gradient_is_taken(tiny_model_dir):
    """Encoding for evaluation, mining and export is one pass, as before."""
    ids, mask = _inputs()
    model = load_sentence_encoder(tiny_model_dir, pooler="mean", dropout=0.1).eval()
    model.mini_batch_size = PIECE
    with torch.no_grad():
        torch.testing.assert_close(model(ids, mask), model._pooled(ids, mask, True), rtol=0, atol=0)
        assert _saved_bytes(model, ids, mask) == 0


def _ddp_rank_gradient(rank: int, model_dir: str) -> dict[str, list]:
    """One rank of two: DDP over the encoder in pieces, this rank's half of the rows."""
    from torch.nn.parallel import DistributedDataParallel

    ids, mask = _inputs()
    half = slice(0, ROWS // 2) if rank == 0 else slice(ROWS // 2, ROWS)
    model = load_sentence_encoder(model_dir, pooler="mean", dropout=0.0).train()
    model.mini_batch_size = 2
    wrapped = DistributedDataParallel(model)
    _loss(wrapped(ids[half], mask[half])).backward()
    return {name: p.grad.tolist() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.slow
def test_ddp_averages_the_gradient_of_pieces_as_of_a_plain_pass(tiny_model_dir):
    """Two gloo ranks, each its half of the rows in pieces of 2 under DDP, against one process
    averaging the two halves' plain gradients: DDP's hooks fire once a parameter although
    each piece is run twice (a reentrant checkpoint would break that)."""
    from conftest import run_on_two_ranks

    got = run_on_two_ranks(_ddp_rank_gradient, str(tiny_model_dir), timeout=300)
    ids, mask = _inputs()
    model = load_sentence_encoder(tiny_model_dir, pooler="mean", dropout=0.0).train()
    for half in (slice(0, ROWS // 2), slice(ROWS // 2, ROWS)):
        (_loss(model(ids[half], mask[half])) / 2).backward()
    want = _gradients(model)
    assert got.keys() == want.keys()
    for name, grad in want.items():
        torch.testing.assert_close(torch.tensor(got[name]), grad, rtol=1e-4, atol=1e-6, msg=name)


def test_a_negative_mini_batch_size_is_one_clear_line():
    with pytest.raises(ConfigError, match=r"train\.mini_batch_size.*>= 0"):
        load_config(None, ["train.mini_batch_size=-1"])
    assert load_config(None, ["train.mini_batch_size=64"]).train.mini_batch_size == 64


def test_the_job_builds_its_model_in_pieces_and_logs_no_param_for_it(tiny_model_dir):
    """The key reaches the model the workers train; like ``train.compile`` it changes how a
    step runs, not what it computes, so it is in ``resolved_config.yaml``, not the params."""
    from pipeline.config.params import params_in_effect
    from pipeline.training.worker_setup import build_model

    cfg = load_config(None, ["train.mini_batch_size=4"])
    assert build_model(cfg, tiny_model_dir, torch.device("cpu")).mini_batch_size == 4
    params = params_in_effect(cfg)
    assert "train.lr" in params and "train.mini_batch_size" not in params
