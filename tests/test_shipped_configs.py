"""Files users copy: every job config loads, and cluster.yaml passes Ray's own schema."""

from __future__ import annotations

import pytest
import yaml
from conftest import REPO

from pipeline.config import load_config


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
