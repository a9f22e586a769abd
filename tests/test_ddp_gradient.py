"""Cross-worker negatives under real Ray Train with two gloo workers.

The gradient of the gathered global-batch loss, after DDP's averaging, must equal one
process computing the loss on the concatenated batch; rows sharing a corpus id must not
be each other's negatives.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch

from pipeline.training.losses import simcse_loss

pytestmark = pytest.mark.slow

N, D_IN, D_OUT = 7, 5, 4  # 7 rows over 2 workers: uneven slices (4 + 3)
IDS = [11, 12, 11, 13, 14, 15, 12]  # rows 0/2 and 1/6 are the same sentence


def _inputs():
    rng = np.random.default_rng(42)
    return rng.normal(size=(N, D_IN)).tolist(), rng.normal(size=(N, D_IN)).tolist()


def ddp_gradient_worker(config):
    """Runs on each Ray Train worker (shipped by value: test modules are not importable there)."""
    import json

    import ray.train
    import ray.train.torch
    import torch

    from pipeline.batching.plan import worker_slices
    from pipeline.training.losses import global_batch_simcse_loss

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    torch.manual_seed(0)
    model = ray.train.torch.prepare_model(torch.nn.Linear(config["d_in"], config["d_out"]))
    x1, x2 = torch.tensor(config["x1"]), torch.tensor(config["x2"])
    sizes = worker_slices(len(x1), world)
    lo = sum(sizes[:rank])
    local = slice(lo, lo + sizes[rank])
    loss, to_backward = global_batch_simcse_loss(
        model(x1[local]), model(x2[local]), sizes, torch.tensor(config["ids"]), config["temperature"]
    )
    to_backward.backward()
    inner = model.module if hasattr(model, "module") else model
    out = {"loss": loss.item(), "world": world, "sizes": sizes}
    out.update({name: p.grad.tolist() for name, p in inner.named_parameters()})
    with open(f"{config['out']}.{rank}.json", "w") as fh:
        json.dump(out, fh)


def test_gathered_loss_gradient_equals_single_process(ray_local, tmp_path):
    import ray.cloudpickle
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    x1, x2 = _inputs()
    config = {
        "x1": x1,
        "x2": x2,
        "ids": IDS,
        "temperature": 0.05,
        "d_in": D_IN,
        "d_out": D_OUT,
        "out": str(tmp_path / "grad"),
    }
    trainer = TorchTrainer(
        ddp_gradient_worker,
        train_loop_config=config,
        scaling_config=ray.train.ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
        torch_config=TorchConfig(backend="gloo"),
        run_config=ray.train.RunConfig(name="ddp-grad", storage_path=str(tmp_path / "storage")),
    )
    result = trainer.fit()
    assert result.error is None
    per_rank = [json.loads((tmp_path / f"grad.{r}.json").read_text()) for r in range(2)]
    assert per_rank[0]["world"] == 2 and per_rank[0]["sizes"] == [4, 3]

    # One process, whole batch, same initial weights.
    torch.manual_seed(0)
    reference = torch.nn.Linear(D_IN, D_OUT)
    ref_loss = simcse_loss(
        reference(torch.tensor(x1)), reference(torch.tensor(x2)), temperature=0.05, row_ids=torch.tensor(IDS)
    )
    ref_loss.backward()
    for rank_out in per_rank:
        assert rank_out["loss"] == pytest.approx(ref_loss.item(), rel=1e-6)
        for name, param in reference.named_parameters():
            got = np.array(rank_out[name])
            want = param.grad.numpy()
            assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5, name

    # Same-id rows were masked: the unmasked loss is different, and the masked one matches
    # the independent numpy reference.
    from test_losses import _numpy_infonce

    with torch.no_grad():
        z1, z2 = reference(torch.tensor(x1)).numpy(), reference(torch.tensor(x2)).numpy()
        unmasked = simcse_loss(torch.tensor(z1), torch.tensor(z2), temperature=0.05).item()
    assert per_rank[0]["loss"] == pytest.approx(_numpy_infonce(z1, z2, 0.05, ids=np.array(IDS)), rel=1e-5)
    assert abs(per_rank[0]["loss"] - unmasked) > 1e-3


def _triplet_inputs():
    """A tiny text corpus (token ids), 7 triplet rows, given and mined negatives with gaps."""
    rng = np.random.default_rng(7)
    tokens = [rng.integers(1, 40, size=rng.integers(3, 8)).tolist() for _ in range(12)]
    anchor, positive = rng.permutation(12)[:7], rng.permutation(12)[:7]
    negative = np.where(rng.random(7) < 0.5, rng.integers(0, 12, size=7), -1)
    mined = np.where(rng.random((7, 2)) < 0.7, rng.integers(0, 12, size=(7, 2)), -1)
    return tokens, anchor.tolist(), positive.tolist(), negative.tolist(), mined.tolist()


def triplet_gradient_worker(config):
    """Runs pipeline.training.step.triplet_batch_loss on each worker's slice of the global batch."""
    import json

    import numpy as np
    import pyarrow as pa
    import ray.train
    import ray.train.torch
    import torch

    from pipeline.batching.plan import worker_slices
    from pipeline.config.loading import load_config
    from pipeline.data.pairs import Triplets
    from pipeline.data.tokenized import TokenizedCorpus
    from pipeline.training.step import triplet_batch_loss

    class BagEncoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(40, 6)

        def forward(self, ids, mask):
            m = mask.unsqueeze(-1).float()
            return (self.embed(ids) * m).sum(1) / m.sum(1)

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    torch.manual_seed(0)
    model = BagEncoder()
    wrapped = ray.train.torch.prepare_model(model) if world > 1 else model
    tokens = config["tokens"]
    table = pa.table({"id": list(range(100, 112)), "input_ids": pa.array(tokens, pa.list_(pa.int32()))})
    corpus = TokenizedCorpus(table, 0)
    triplets = Triplets(*(np.array(config[k]) for k in ("anchor", "positive", "negative")))
    rows = np.arange(7)
    sizes = worker_slices(7, world)
    lo = sum(sizes[:rank])
    cfg = load_config(None, ["train.temperature=0.05", "train.hard_negative_weight=0.5"])
    loss, to_backward = triplet_batch_loss(
        wrapped, corpus, triplets, np.array(config["mined"]), rows[lo : lo + sizes[rank]], rows, sizes, cfg,
        torch.device("cpu"),
    )  # fmt: skip
    to_backward.backward()
    with open(f"{config['out']}.{rank}.json", "w") as fh:
        json.dump({"loss": loss.item(), "grad": model.embed.weight.grad.tolist()}, fh)


def test_triplet_loss_gradient_equals_single_process(ray_local, tmp_path):
    import ray.cloudpickle
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    tokens, anchor, positive, negative, mined = _triplet_inputs()
    config = {"tokens": tokens, "anchor": anchor, "positive": positive, "negative": negative, "mined": mined}
    TorchTrainer(
        triplet_gradient_worker,
        train_loop_config={**config, "out": str(tmp_path / "ddp")},
        scaling_config=ray.train.ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
        torch_config=TorchConfig(backend="gloo"),
        run_config=ray.train.RunConfig(name="triplet-grad", storage_path=str(tmp_path / "storage")),
    ).fit()
    TorchTrainer(
        triplet_gradient_worker,
        train_loop_config={**config, "out": str(tmp_path / "single")},
        scaling_config=ray.train.ScalingConfig(num_workers=1, resources_per_worker={"CPU": 1}),
        run_config=ray.train.RunConfig(name="triplet-single", storage_path=str(tmp_path / "storage")),
    ).fit()
    single = json.loads((tmp_path / "single.0.json").read_text())
    for rank in range(2):
        got = json.loads((tmp_path / f"ddp.{rank}.json").read_text())
        assert got["loss"] == pytest.approx(single["loss"], rel=1e-6)
        g, want = np.array(got["grad"]), np.array(single["grad"])
        assert np.linalg.norm(g - want) / np.linalg.norm(want) < 1e-5
