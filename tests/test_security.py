"""Security defaults: configs and checkpoints cannot run code, and a Ray the job starts keeps
its dashboard (which serves the job-submission API) on the loopback interface."""

from __future__ import annotations

import os

import psutil
import pytest
import torch

from pipeline.config.loading import load_config
from pipeline.core.errors import ConfigError


def test_config_with_a_python_tag_is_rejected_without_running_it(tmp_path):
    marker = tmp_path / "ran"
    config = tmp_path / "evil.yaml"
    config.write_text(f'train:\n  epochs: !!python/object/apply:os.system ["touch {marker}"]\n')
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_config(config)
    # An override is parsed the same safe way: the tag stays a literal string and fails the type check.
    with pytest.raises(ConfigError, match="train.epochs must be an integer"):
        load_config(None, [f'train.epochs=!!python/object/apply:os.system ["touch {marker}"]'])
    assert not marker.exists()


class _RunsCode:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_checkpoint_state_carrying_code_is_refused(tmp_path, tiny_model_dir):
    """A tampered ``train_state.pt`` (storage is often shared) is refused, never unpickled into code."""
    from pipeline.training.checkpoint import STATE_FILE, load_checkpoint

    marker = tmp_path / "ran"
    (tmp_path / "ckpt").mkdir()
    torch.save({"epoch": _RunsCode(str(marker))}, tmp_path / "ckpt" / STATE_FILE)
    with pytest.raises(Exception, match="Weights only load failed"):
        load_checkpoint(tmp_path / "ckpt")
    assert not marker.exists()


def test_local_ray_dashboard_listens_on_loopback_only(ray_local):
    """The session's Ray was started the way a job starts its own (``init_ray``)."""
    url = ray_local._private.worker.get_dashboard_url()
    host, port = url.removeprefix("http://").rsplit(":", 1)
    assert host == "127.0.0.1", url
    listening = [
        c.laddr.ip
        for c in psutil.net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == int(port)
    ]
    assert listening and set(listening) == {"127.0.0.1"}, listening
