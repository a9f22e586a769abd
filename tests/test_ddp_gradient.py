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

from pipeline.losses import simcse_loss

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

    from pipeline.losses import global_batch_simcse_loss
    from pipeline.plans import worker_slices

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
