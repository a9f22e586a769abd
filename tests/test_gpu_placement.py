"""GPUs placed as reserved, on a multi-node cluster with logical GPUs (this machine has none).

The train workers and the miner are placed with the job's own options
(:func:`pipeline.training.trainer.scaling_config`,
:func:`pipeline.mining.miner_actor.miner_actor_options`) on a cluster whose one GPU node has
3 logical GPUs, so that they must share that node, beside a head with CPUs only; a probe in
each process reports what Ray gave it and what it sees. Nothing trains: a CPU torch
cannot initialise CUDA, so the probe stands in for the train loop and the miner's work, and
the workers' collective is gloo (the job's would be NCCL, which needs the devices).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import PYTHON, REPO

from bench.common import job_env
from bench.local_cluster import RayHead, RayWorkerNode
from pipeline.runtime.cluster import free_port

# Two workers of one GPU each and a miner with a GPU of its own, as
# docs/operations.md's KubeRay example scales them.
SETTINGS = ["train.num_workers=2", "train.gpus_per_worker=1", "mining.num_gpus=1", "mining.num_cpus=0.25"]

PROBE = """
import json, os, sys
from pathlib import Path

import ray
import ray.train
from ray.train.torch import TorchConfig, TorchTrainer

from pipeline.config.loading import load_config
from pipeline.mining.miner_actor import miner_actor_options
from pipeline.mining.miner_settings import MinerSettings
from pipeline.training.trainer import scaling_config

config, out = sys.argv[1], Path(sys.argv[2])
cfg = load_config(config, sys.argv[3:])


def seen(role):
    return {
        "role": role,
        "node": ray.get_runtime_context().get_node_id(),
        "gpu_ids": sorted(str(g) for g in ray.get_gpu_ids()),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


class Miner:
    def seen(self):
        return seen("miner")


def loop(_):
    rank = ray.train.get_context().get_world_rank()
    (out / f"worker{rank}.json").write_text(json.dumps(seen("worker")))


ray.init(address=os.environ["RAY_ADDRESS"])
settings = MinerSettings.from_config(cfg, None, None)
miner = ray.remote(Miner).options(**miner_actor_options(settings)).remote()
(out / "miner.json").write_text(json.dumps(ray.get(miner.seen.remote(), timeout=300)))
# The miner holds its GPU while the workers are placed, as in a job.
TorchTrainer(
    loop,
    scaling_config=scaling_config(cfg),
    torch_config=TorchConfig(backend="gloo"),
    run_config=ray.train.RunConfig(name="probe", storage_path=str(out / "storage")),
).fit()
"""


@pytest.mark.slow
def test_train_workers_and_the_miner_hold_disjoint_gpus_and_see_what_they_reserved(tmp_path):
    # The head is the node of CPUs only (where the driver runs), so that what needs a GPU must
    # go to the other.
    head = RayHead(tmp_path / "head", num_cpus=2, ray_tmpdir=Path("/tmp") / f"rtg{free_port()}")
    nodes = []
    try:
        nodes = [RayWorkerNode(head, "gpu", num_cpus=2, num_gpus=3)]
        out = tmp_path / "seen"
        out.mkdir()
        proc = subprocess.run(
            [PYTHON, "-c", PROBE, str(REPO / "jobs/configs/demo.yaml"), str(out), *SETTINGS],
            cwd=REPO, env=job_env({"RAY_ADDRESS": head.address, "RAY_API_SERVER_ADDRESS": head.dashboard}),
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
        named = {node_id: name for name, node_id in head.node_ids().items()}
    finally:
        for node in nodes:
            node.stop()
        head.stop()
    miner = json.loads((out / "miner.json").read_text())
    workers = [json.loads(path.read_text()) for path in sorted(out.glob("worker*.json"))]
    assert len(workers) == 2
    assert {named[p["node"]] for p in [miner, *workers]} == {"gpu"}

    # Each holds one GPU, and no GPU is held twice.
    held = [(p["node"], gpu) for p in [miner, *workers] for gpu in p["gpu_ids"]]
    assert [len(p["gpu_ids"]) for p in [miner, *workers]] == [1, 1, 1]
    assert len(set(held)) == 3, held
    # The miner sees exactly its GPU.
    assert miner["cuda_visible_devices"] == miner["gpu_ids"][0]
    # A worker sees its own GPU and the other worker's, never the miner's: Ray Train shows
    # workers on one node each other's GPUs (NCCL's peer access), and each trains on its own
    # (ray.train.torch.get_device picks it by its id).
    both = sorted(g for w in workers for g in w["gpu_ids"])
    for worker in workers:
        visible = worker["cuda_visible_devices"].split(",")
        assert sorted(visible) == both, (worker, workers)
        assert miner["gpu_ids"][0] not in visible
