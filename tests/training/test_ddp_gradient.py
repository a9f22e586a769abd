"""Cross-worker negatives under real Ray Train with two gloo workers.

The train step (pipeline/training/step.py and its two strategies) on each worker's slice: the gradient of the
gathered global-batch loss, after DDP's averaging, must equal one process computing the loss
on the concatenated batch; and rows sharing a corpus id must not be each other's negatives.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch

from pipeline.training.losses import simcse_loss

pytestmark = pytest.mark.slow

N = 7  # 7 rows over 2 workers: uneven slices (4 + 3)
IDS = [11, 12, 11, 13, 14, 15, 12]  # rows 0/2 and 1/6 are the same sentence
POSITIONS = [0, 1, 0, 2, 3, 4, 1]
"""The rows as corpus positions (one position per distinct text): what the plan's batch holds."""
VOCAB = 40
DUP_RATE = 0.3  # word repetition: the two views differ without dropout
# Bag-of-words views are nearly the same: at SimCSE's 0.05 the loss would be ~1e-3, too near
# zero for a float32 comparison.
TEMPERATURE = 0.5


class BagEncoder(torch.nn.Module):
    """Mean of token embeddings: deterministic (no dropout) and blind to padding."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 6)

    def forward(self, ids, mask):
        m = mask.unsqueeze(-1).float()
        return (self.embed(ids) * m).sum(1) / m.sum(1)


def _corpus(tokens, ids=None):
    import pyarrow as pa

    from pipeline.data.tokenized import TokenizedCorpus

    ids = list(range(100, 100 + len(tokens))) if ids is None else ids
    return TokenizedCorpus(pa.table({"id": ids, "input_ids": pa.array(tokens, pa.list_(pa.int32()))}), 0)


def _distinct_corpus(tokens):
    """The corpus of the distinct sentences: position ``POSITIONS[i]`` holds row i's tokens."""
    first = [POSITIONS.index(p) for p in range(max(POSITIONS) + 1)]
    return _corpus([tokens[i] for i in first], sorted(set(IDS)))


def _sentences():
    """N token rows; rows with the same id (IDS) hold the same tokens."""
    rng = np.random.default_rng(42)
    tokens = [rng.integers(1, VOCAB, size=rng.integers(4, 9)).tolist() for _ in range(N)]
    tokens[2], tokens[6] = tokens[0], tokens[1]
    return tokens


def _unsupervised_gradient(config, rank: int, world: int) -> dict:
    """pipeline.training.unsupervised_step.UnsupervisedStep on this rank's slice: the step's
    loss and gradient."""
    import ray.train.torch

    from pipeline.batching.plan import worker_slices
    from pipeline.training.global_batch import GlobalBatch
    from pipeline.training.unsupervised_step import UnsupervisedStep

    torch.manual_seed(0)
    model = BagEncoder()
    wrapped = ray.train.torch.prepare_model(model)
    corpus = _distinct_corpus(config["tokens"])
    sizes = worker_slices(N, world)
    step = UnsupervisedStep(corpus, config["temperature"], DUP_RATE, torch.device("cpu"))
    loss, to_backward = step(
        wrapped, GlobalBatch(np.array(POSITIONS), sizes, rank), np.random.default_rng([0, rank])
    )
    to_backward.backward()
    return {"loss": loss.item(), "grad": model.embed.weight.grad.tolist(), "world": world, "sizes": sizes}


def ddp_gradients_worker(config):
    """Each Ray Train worker runs both train steps on its slice (the module is shipped by value:
    test modules are not importable there) and writes their losses and gradients. One
    ``fit()`` for both: each costs a worker group's start."""
    import json

    import ray.train

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    outputs = {
        "unsupervised": _unsupervised_gradient(config["unsupervised"], rank, world),
        "triplet": _triplet_gradient(config["triplet"], rank, world),
    }
    with open(f"{config['out']}.{rank}.json", "w") as fh:
        json.dump(outputs, fh)


@pytest.fixture(scope="module")
def ddp_gradients(ray_local, tmp_path_factory):
    """Both steps' loss and gradient on each of two gloo workers (a list by rank)."""
    import ray.cloudpickle
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    tmp_path = tmp_path_factory.mktemp("ddp")
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    tokens, anchor, positive, negative, mined = _triplet_inputs()
    config = {
        "unsupervised": {"tokens": _sentences(), "temperature": TEMPERATURE},
        "triplet": {
            "tokens": tokens,
            "anchor": anchor,
            "positive": positive,
            "negative": negative,
            "mined": mined,
        },
        "out": str(tmp_path / "grad"),
    }
    result = TorchTrainer(
        ddp_gradients_worker,
        train_loop_config=config,
        scaling_config=ray.train.ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
        torch_config=TorchConfig(backend="gloo"),
        run_config=ray.train.RunConfig(name="ddp-grad", storage_path=str(tmp_path / "storage")),
    ).fit()
    assert result.error is None
    return [json.loads((tmp_path / f"grad.{r}.json").read_text()) for r in range(2)], config


@pytest.mark.job
def test_ddp_gradients_equal_single_process(ddp_gradients):
    """One test over the workers' run (a fixture shared by two tests would be made twice when
    pytest-xdist sends them to different test processes)."""
    per_rank, config = ddp_gradients
    _gathered_loss_gradient_equals_single_process([r["unsupervised"] for r in per_rank])
    _triplet_loss_gradient_equals_single_process([r["triplet"] for r in per_rank], config["triplet"])


def _gathered_loss_gradient_equals_single_process(per_rank: list[dict]) -> None:
    tokens = _sentences()
    assert per_rank[0]["world"] == 2 and per_rank[0]["sizes"] == [4, 3]

    # One process, whole batch, same initial weights, and the same views.
    reference, z1, z2 = _reference_views(tokens)
    ref_loss = simcse_loss(z1, z2, temperature=TEMPERATURE, row_ids=torch.tensor(IDS))
    ref_loss.backward()
    want = reference.embed.weight.grad.numpy()
    for rank_out in per_rank:
        assert rank_out["loss"] == pytest.approx(ref_loss.item(), rel=1e-6)
        got = np.array(rank_out["grad"])
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5

    # Same-id rows were masked: the unmasked loss is different, and the masked one matches
    # the independent numpy reference.
    from test_losses import _numpy_infonce

    z1, z2 = z1.detach().numpy(), z2.detach().numpy()
    assert not np.allclose(z1, z2)  # word repetition made two different views
    unmasked = simcse_loss(torch.tensor(z1), torch.tensor(z2), temperature=TEMPERATURE).item()
    assert per_rank[0]["loss"] == pytest.approx(
        _numpy_infonce(z1, z2, TEMPERATURE, ids=np.array(IDS)), rel=1e-5
    )
    assert abs(per_rank[0]["loss"] - unmasked) > 1e-3


def _reference_views(tokens):
    """One process's view of the whole global batch: the same initial weights, each rank's
    rows with the second view drawn from that rank's generator, as the workers draw them."""
    from pipeline.training.unsupervised_step import two_views

    torch.manual_seed(0)
    reference = BagEncoder()
    corpus = _corpus(tokens, IDS)
    views = []
    for rank, rows in enumerate((np.arange(4), np.arange(4, N))):
        ids, mask = two_views(corpus, rows, DUP_RATE, np.random.default_rng([0, rank]))
        views.append(reference(torch.from_numpy(ids), torch.from_numpy(mask)).split(len(rows)))
    z1 = torch.cat([first for first, _ in views])
    z2 = torch.cat([second for _, second in views])
    return reference, z1, z2


def _triplet_inputs():
    """A tiny text corpus (token ids), 7 triplet rows, given and mined negatives with gaps."""
    rng = np.random.default_rng(7)
    tokens = [rng.integers(1, 40, size=rng.integers(3, 8)).tolist() for _ in range(12)]
    anchor, positive = rng.permutation(12)[:7], rng.permutation(12)[:7]
    negative = np.where(rng.random(7) < 0.5, rng.integers(0, 12, size=7), -1)
    mined = np.where(rng.random((7, 2)) < 0.7, rng.integers(0, 12, size=(7, 2)), -1)
    return tokens, anchor.tolist(), positive.tolist(), negative.tolist(), mined.tolist()


def _triplet_gradient(config, rank: int, world: int) -> dict:
    """pipeline.training.triplet_step's TripletStep on this rank's slice of the global batch
    (the whole batch, unwrapped, when ``world`` is 1): its loss and gradient."""
    import ray.train.torch

    from pipeline.batching.plan import worker_slices
    from pipeline.config.loading import load_config
    from pipeline.data.triplets import Triplets
    from pipeline.training.global_batch import GlobalBatch
    from pipeline.training.step import make_train_step

    torch.manual_seed(0)
    model = BagEncoder()
    wrapped = ray.train.torch.prepare_model(model) if world > 1 else model
    corpus = _corpus(config["tokens"])
    triplets = Triplets(*(np.array(config[k]) for k in ("anchor", "positive", "negative")))
    cfg = load_config(None, [
        "task=pairs", "data.path=rows.jsonl", "train.temperature=0.05",
        "train.hard_negative_weight=0.5",
    ])  # fmt: skip
    step = make_train_step(cfg, corpus, triplets, torch.device("cpu"))
    sizes = worker_slices(7, world)
    batch = GlobalBatch(np.arange(7), sizes, rank, np.array(config["mined"]))
    loss, to_backward = step(wrapped, batch, np.random.default_rng([0, rank]))
    to_backward.backward()
    return {"loss": loss.item(), "grad": model.embed.weight.grad.tolist()}


def _triplet_loss_gradient_equals_single_process(per_rank: list[dict], config: dict) -> None:
    single = _triplet_gradient(config, rank=0, world=1)  # here, one process, the whole batch
    for got in per_rank:
        assert got["loss"] == pytest.approx(single["loss"], rel=1e-6)
        g, want = np.array(got["grad"]), np.array(single["grad"])
        assert np.linalg.norm(g - want) / np.linalg.norm(want) < 1e-5
