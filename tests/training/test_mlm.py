"""SimCSE's auxiliary MLM objective (``train.mlm_weight``): BERT's masking, and the step's loss
against an independent computation (transformers' ``BertForMaskedLM`` given the same weights),
with the gradient over two gloo ranks equal to one process's on the whole batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import run_on_two_ranks
from transformers import BertConfig, BertForMaskedLM, BertModel

from pipeline.config.loading import load_config
from pipeline.core.errors import ConfigError
from pipeline.model.encoder import SentenceEncoder
from pipeline.training.losses import simcse_loss
from pipeline.training.masking import IGNORED, MaskingSpec, mask_tokens
from pipeline.training.mlm_loss import masked_lm_loss
from pipeline.training.unsupervised_step import UnsupervisedStep, ViewBatch

CLS, SEP, PAD, MASK, VOCAB = 2, 3, 0, 4, 50
SPEC = MaskingSpec(MASK, VOCAB, (PAD, 1, CLS, SEP, MASK))


def _batch(rows: int, width: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """[CLS] words [SEP] then padding, rows of random lengths."""
    ids = np.full((rows, width), PAD, dtype=np.int64)
    mask = np.zeros((rows, width), dtype=np.int64)
    for i, length in enumerate(rng.integers(3, width + 1, size=rows)):
        ids[i, :length] = [CLS, *rng.integers(5, VOCAB, size=length - 2), SEP]
        mask[i, :length] = 1
    return ids, mask


def test_bert_masking_chooses_15_percent_of_words_and_replaces_them_80_10_10():
    rng = np.random.default_rng(0)
    ids, mask = _batch(4000, 24, rng)
    masked, labels = mask_tokens(ids, mask, SPEC, np.random.default_rng(1))
    chosen = labels != IGNORED
    words = (mask > 0) & (ids >= 5)
    assert not (chosen & ~words).any()  # never [CLS], [SEP] or padding
    assert np.array_equal(labels[chosen], ids[chosen])
    assert np.array_equal(masked[~chosen], ids[~chosen])
    share = chosen.sum() / words.sum()
    assert abs(share - 0.15) < 0.005, share
    as_mask = (masked[chosen] == MASK).mean()
    kept = (masked[chosen] == ids[chosen]).mean()  # 10% kept, plus random draws of the same id
    assert abs(as_mask - 0.8) < 0.01 and abs(kept - (0.1 + 0.1 / VOCAB)) < 0.01, (as_mask, kept)


def _model(seed: int = 0) -> tuple[SentenceEncoder, BertConfig]:
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=64, pad_token_id=PAD,
    )  # fmt: skip
    encoder = SentenceEncoder(BertModel(config, add_pooling_layer=False), "mean", use_mlp=False, use_mlm=True)
    with torch.no_grad():  # the head starts at zero bias; make it count
        encoder.mlm_head.bias.normal_()
    return encoder.eval(), config


def _reference_mlm_loss(model: SentenceEncoder, config: BertConfig, masked, mask, labels) -> torch.Tensor:
    """transformers' own MLM loss with the same encoder and head weights."""
    reference = BertForMaskedLM(config).eval()
    reference.bert.load_state_dict(model.encoder.state_dict(), strict=False)
    head = reference.cls.predictions
    head.transform.dense.load_state_dict(model.mlm_head.dense.state_dict())
    head.transform.LayerNorm.load_state_dict(model.mlm_head.layer_norm.state_dict())
    head.bias.data.copy_(model.mlm_head.bias.data)
    head.decoder.bias = head.bias
    reference.tie_weights()
    assert torch.equal(head.decoder.weight, model.encoder.get_input_embeddings().weight)
    return reference(input_ids=masked, attention_mask=mask, labels=labels).loss


def test_the_steps_loss_is_infonce_plus_the_weighted_mlm_loss_of_transformers():
    model, config = _model()
    rng = np.random.default_rng(3)
    ids, mask = _batch(6, 12, rng)
    views, views_mask = np.concatenate([ids, ids]), np.concatenate([mask, mask])
    masked, labels = mask_tokens(views, views_mask, SPEC, rng)
    step = UnsupervisedStep(None, 0.05, 0.0, torch.device("cpu"), bf16=False, mlm_weight=0.1, masking=SPEC)
    batch = ViewBatch(views, views_mask, np.arange(6), masked, labels)
    loss, backward = step.on_device(model, batch, [6])
    with torch.no_grad():
        embeddings = model(torch.tensor(views), torch.tensor(views_mask))
        infonce = simcse_loss(embeddings[:6], embeddings[6:], 0.05, row_ids=torch.arange(6))
        mlm = _reference_mlm_loss(
            model, config, torch.tensor(masked), torch.tensor(views_mask), torch.tensor(labels)
        )
    assert loss.item() == pytest.approx((infonce + 0.1 * mlm).item(), rel=1e-5)
    assert backward.item() == pytest.approx(loss.item(), rel=1e-5)  # one process
    # The head learns: its bias gets a gradient, and so do the shared word embeddings.
    backward.backward()
    assert model.mlm_head.bias.grad.abs().sum() > 0


def _rank_gradient(rank: int, features, weight, labels, cuts):
    import torch.distributed as dist

    shared = weight.clone().requires_grad_(True)  # a parameter every rank holds, as the head's
    lo, hi = cuts[rank], cuts[rank + 1]
    loss, backward = masked_lm_loss(features[lo:hi] @ shared.T, labels[lo:hi])
    backward.backward()
    grad = shared.grad.clone()
    dist.all_reduce(grad)
    grad /= 2  # DDP's gradient: the mean over ranks
    return loss.item(), grad.numpy()


@pytest.mark.slow
def test_two_ranks_with_uneven_masked_tokens_get_the_one_process_gradient():
    torch.manual_seed(0)
    features, weight = torch.randn(11, 8), torch.randn(VOCAB, 8)
    labels = torch.randint(0, VOCAB, (11,))
    # 2 masked tokens on rank 0, 9 on rank 1
    loss, grad = run_on_two_ranks(_rank_gradient, features, weight, labels, (0, 2, 11))
    whole = weight.clone().requires_grad_(True)
    expected = torch.nn.functional.cross_entropy(features @ whole.T, labels)
    expected.backward()
    assert loss == pytest.approx(expected.item(), rel=1e-6)
    assert np.allclose(grad, whole.grad.numpy(), atol=1e-6)


def test_mlm_weight_is_a_corpus_key():
    assert load_config(None, ["train.mlm_weight=0.1"]).train.mlm_weight == 0.1
    with pytest.raises(ConfigError, match="needs task: corpus"):
        load_config(None, ["task=pairs", "data.path=rows.jsonl", "train.mlm_weight=0.1"])
    with pytest.raises(ConfigError, match="train.mlm_weight must be >= 0"):
        load_config(None, ["train.mlm_weight=-1"])
