"""Files users copy: every job config loads, and cluster.yaml passes Ray's own schema."""

from __future__ import annotations

import pytest
import yaml
from conftest import REPO

from pipeline.config.loading import load_config


@pytest.mark.parametrize("path", sorted((REPO / "jobs/configs").glob("*.yaml")), ids=lambda p: p.name)
def test_job_configs_load(path):
    cfg = load_config(path)
    assert cfg.train.temperature > 0


def test_cluster_yaml_is_a_valid_ray_cluster_config():
    import json
    from pathlib import Path

    import jsonschema
    import ray.autoscaler

    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    config = yaml.safe_load((REPO / "cluster.yaml").read_text())
    jsonschema.validate(config, schema)  # raises on a schema violation
    nodes = config["available_node_types"]
    assert nodes[config["head_node_type"]]["resources"]["GPU"] == 0
    assert any("[gpu]" in cmd for cmd in config["setup_commands"])
    assert all(
        "--dashboard-host=127.0.0.1" in cmd for cmd in config["head_start_ray_commands"] if "--head" in cmd
    )


def _readme_block(section: str) -> str:
    """The first fenced code block under README heading ``section``."""
    readme = (REPO / "README.md").read_text()
    body = readme[readme.index(f"\n## {section}\n") :]
    return body.split("```bash\n", 1)[1].split("```", 1)[0]


def test_your_corpus_config_is_a_real_model_recipe_the_readme_example_uses():
    import shlex

    path = REPO / "jobs/configs/your-corpus.yaml"
    cfg = load_config(path)
    assert cfg.model.name_or_path == "sentence-transformers/all-MiniLM-L6-v2" and cfg.model.pooler == "mean"
    assert cfg.data.max_seq_len >= 64 and cfg.train.lr == 3e-5 and cfg.train.batch_size == 64
    assert (cfg.train.num_workers, cfg.train.gpus_per_worker) == (1, 0)
    assert cfg.ray.num_cpus is None  # the machine's CPUs: no oversubscription like the demo's
    assert not cfg.runs_miner and cfg.train.epochs >= 2  # random batches need no miner (docs/results.md)
    assert cfg.eval.sts == [] and cfg.tracking.experiment == "simcse"
    assert cfg.data.generated.sts_pairs == 0 and cfg.run.name is None

    # The README's corpus quickstart runs this config, and what it sets loads.
    words = shlex.split(_readme_block("Quickstart: your corpus (unsupervised SimCSE)").replace("\\\n", " "))
    assert words[words.index("--config") + 1] == "jobs/configs/your-corpus.yaml"
    overrides = [words[i + 1] for i, word in enumerate(words) if word == "--set"]
    assert any(o.startswith("data.path=") for o in overrides)
    assert any(o.startswith("model.name_or_path=") for o in overrides)
    cfg = load_config(path, overrides)
    assert cfg.data.path != load_config(path).data.path
