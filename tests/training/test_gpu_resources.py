"""GPU resources come from config: what Ray reserves per worker, the collective backend, and
the resource check, for whole and fractional GPUs (checked on CPU: nothing here runs on a GPU)."""

from __future__ import annotations

import pytest
from conftest import REPO

from pipeline.config.loading import load_config
from pipeline.core.errors import ConfigError
from pipeline.mining.miner_actor import miner_actor_options
from pipeline.mining.miner_settings import MinerSettings
from pipeline.mining.miner_shards import shard_actor_options
from pipeline.runtime.cluster import check_cluster_fits, miner_shards
from pipeline.training.trainer import build_trainer

DEMO = REPO / "jobs/configs/demo.yaml"  # 2 workers


@pytest.mark.parametrize(
    "overrides,gpus,backend",
    [
        ([], None, "gloo"),
        (["train.gpus_per_worker=1"], 1.0, "nccl"),
        # Two ranks may share one GPU, which NCCL refuses: gloo, which reduces CUDA tensors too.
        (["train.gpus_per_worker=0.5"], 0.5, "gloo"),
        # One rank on half a GPU (the miner on the other half): no peer, NCCL is fine.
        (["train.gpus_per_worker=0.5", "train.num_workers=1"], 0.5, "nccl"),
    ],
)
def test_trainer_reserves_the_configured_gpus_and_picks_the_backend(
    overrides, gpus, backend, tmp_path, monkeypatch
):
    monkeypatch.delenv("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", raising=False)  # build_trainer sets it
    cfg = load_config(DEMO, [f"run.output_dir={tmp_path}", "train.cpus_per_worker=0.5", *overrides])
    trainer = build_trainer(cfg, None, str(tmp_path / "storage"), "gpu-resources")
    resources = trainer.scaling_config.resources_per_worker
    assert resources.get("GPU") == gpus and resources["CPU"] == 0.5
    assert trainer.scaling_config.use_gpu is (gpus is not None)
    assert trainer.backend_config.backend == backend


@pytest.mark.parametrize(("debug", "level"), [(False, "CRITICAL"), (True, "INFO")])
def test_ray_train_console_logs_are_on_only_with_debug(debug, level, tmp_path, monkeypatch):
    """Ray Train's failure reports are tracebacks: off unless the job runs with --debug."""
    monkeypatch.delenv("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", raising=False)  # build_trainer sets it
    cfg = load_config(DEMO, [f"run.output_dir={tmp_path}"])
    trainer = build_trainer(cfg, None, str(tmp_path / "storage"), "log-level", debug=debug)
    assert trainer.run_config.logging_config.log_level == level


@pytest.mark.parametrize("value", ["-1", "-0.5", "1.5", "2"])
def test_gpus_per_worker_is_at_most_one_gpu_a_worker(value):
    """A worker's model sits on one device: a second GPU reserved per worker would idle, so it
    is refused with the way to more GPUs (Ray Train's convention: more workers)."""
    with pytest.raises(ConfigError, match=r"train\.gpus_per_worker.*in \[0, 1\].*raise train\.num_workers"):
        load_config(DEMO, [f"train.gpus_per_worker={value}"])


def test_resource_check_counts_fractional_gpus(ray_local, tmp_path):
    cfg = load_config(
        DEMO,
        [
            f"run.output_dir={tmp_path}",
            "train.gpus_per_worker=0.25",
            "mining.num_gpus=0.5",
        ],
    )
    # 2 x 0.25 + 0.5 = 1 GPU, and this local Ray has none.
    with pytest.raises(ConfigError, match=r"1 GPUs needed \(train\.num_workers x train\.gpus_per_worker"):
        check_cluster_fits(cfg, started_locally=True)


MINER = ["mining.batch_sampler=knn", "mining.refresh=every_epoch", "train.num_workers=4"]


@pytest.mark.parametrize(
    "overrides,cluster_gpus,shards",
    [
        (["train.gpus_per_worker=1", "mining.num_gpus=1"], 8, 4),  # ANCE's 4 + 4
        (["train.gpus_per_worker=1", "mining.num_gpus=1"], 4, 1),  # no spare GPU: the miner alone
        (["train.gpus_per_worker=1", "mining.num_gpus=0.5"], 5, 2),  # two halves of the spare GPU
        (["train.gpus_per_worker=0.5", "mining.num_gpus=1"], 4, 2),
        ([], 8, 1),  # a CPU miner: one, whatever the GPUs
        (["train.gpus_per_worker=1", "mining.num_gpus=1", "mining.shards=3"], 8, 3),  # set: kept
        (["train.gpus_per_worker=1", "mining.num_gpus=1", "mining.refresh=never"], 8, 1),  # no miner
    ],
)
def test_miner_shards_default_to_the_gpus_beyond_the_trainers(overrides, cluster_gpus, shards):
    cfg = load_config(DEMO, [*MINER, *overrides])
    assert miner_shards(cfg, {"CPU": 64.0, "GPU": float(cluster_gpus)}) == shards


def test_sharded_miner_reserves_its_shards_gpus_not_its_own(ray_local, tmp_path):
    cfg = load_config(DEMO, [*MINER, f"run.output_dir={tmp_path}", "mining.num_gpus=0.5", "mining.shards=3"])
    settings = MinerSettings.from_config(cfg)
    # CPUs: the miner and 3 shards; GPUs: the shards only.
    assert settings.reserved() == (4 * cfg.mining.num_cpus, 1.5)
    assert miner_actor_options(settings)["num_gpus"] == 0.0
    assert shard_actor_options(settings)["num_gpus"] == 0.5
    with pytest.raises(ConfigError, match=r"1\.5 GPUs needed .*mining\.num_gpus x 3 mining\.shards\)"):
        check_cluster_fits(cfg, started_locally=True)
