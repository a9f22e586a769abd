"""The metric catalogue is the one list of metric keys: the source, the miner's real output,
the runs and docs/mlflow.md are held to it, so a renamed or new metric is a visible change.
(The demo-sized run's keys are checked in tests/test_end_to_end.py.)"""

from __future__ import annotations

import ast
import json
import re
import tempfile
from pathlib import Path

import pytest
from conftest import REPO, blocks_of
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_LOGGED_ARTIFACTS

from pipeline.config.metric_catalogue import (
    CATALOGUE,
    MAX_MINING_CHARTS,
    MINING_TABLE,
    mining_charts,
    spec_for,
    undeclared,
)
from pipeline.mining.hard_negatives import SearchSettings
from pipeline.tracking.refresh_table import add_refresh, read_refresh_table

KEY = re.compile(r"^(train|eval|best|mining|data|system)/[a-z0-9_]+$")
BOUNDARY_CHARTS = ("mining/refresh_wait_s", "mining/next_plan_staleness_steps", "mining/refresh_late",
                   "mining/miner_restarts")  # fmt: skip
"""What rank 0 and the miner client chart beside a refresh's own charts."""
TABLE_ROUNDING = 5e-4
"""The refresh table keeps 4 significant digits: a value comes back within half a unit of its
4th digit."""


def test_patterns_are_unique_and_match_what_they_name():
    patterns = [spec.pattern for spec in CATALOGUE]
    assert len(patterns) == len(set(patterns))
    assert all(spec.doc.endswith((".", ")")) and len(spec.doc) <= 100 for spec in CATALOGUE)
    assert spec_for("eval/sts_stsb-dev_mrr_at_10").pattern == "eval/sts_{set}_mrr_at_10"
    assert spec_for("eval/retrieval_twitter_url_dev_ndcg_at_10").kind == "chart"
    assert spec_for("mining/removed_known_positive").kind == "table"
    assert spec_for("mining/negative_similarity_mean").kind == "chart"  # the one percentile charted
    assert spec_for("mining/removed_known_positive", kinds=("chart",)) is None
    assert undeclared({"train/loss", "train/los", "mining/plan_versions"}) == [
        "mining/plan_versions",
        "train/los",
    ]


def test_every_metric_key_written_in_the_source_is_declared():
    """A key literal in pipeline/ that the catalogue does not know fails here, before any run."""
    found: dict[str, str] = {}
    for path in sorted((REPO / "pipeline").rglob("*.py")):
        if path.name == "metric_catalogue.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        # An f-string key (f"mining/removed_{name}") is checked with "x" for each field.
        parts = {
            id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr):
                text = "".join(p.value if isinstance(p, ast.Constant) else "x" for p in node.values)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in parts:
                text = node.value
            else:
                continue
            if KEY.match(text) and not text.endswith("/x"):  # "/x": a prefix put on keys made elsewhere
                found[text] = str(path.relative_to(REPO))
    assert len(found) > 30  # the scan sees the keys (train/loss, mining/total_s ...)
    assert {key: found[key] for key in undeclared(set(found))} == {}


def test_docs_list_the_catalogue():
    text = (REPO / "docs/mlflow.md").read_text(encoding="utf-8")
    assert [spec.pattern for spec in CATALOGUE if f"`{spec.pattern}`" not in text] == []


def _refresh_twice(tmp_path, model_dir, tokenized, triplets=None):
    from pipeline.mining.miner import HardNegativeMiner
    from pipeline.mining.miner_settings import MinerSettings
    from pipeline.mining.negatives import NegativeFilters
    from pipeline.model.encoder import load_sentence_encoder
    from pipeline.model.folders import pack_dir

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlruns.db'}")
    experiment = client.create_experiment("catalogue", artifact_location=str(tmp_path / "artifacts"))
    run_id = client.create_run(experiment).info.run_id
    settings = MinerSettings(
        pooler="mean", batch_size=32, search=SearchSettings(top_k=16), seed=0,
        filters=NegativeFilters(num_negatives=1), tracking_uri=client.tracking_uri, run_id=run_id,
    )  # fmt: skip
    miner = HardNegativeMiner(blocks_of(tokenized), pack_dir(model_dir), settings, triplets=triplets)
    weights = load_sentence_encoder(model_dir, pooler="mean").encoder.state_dict()
    reports = [miner.refresh(weights, version=v, step=step) for v, step in ((1, 0), (2, 12))]
    miner.wait_logged(timeout=120)
    return client, run_id, reports


def _assert_charts_and_table(client, run_id, reports):
    run = client.get_run(run_id)
    charted = set(run.data.metrics)
    assert charted == set(mining_charts(reports[-1].metrics))
    assert len(charted | set(BOUNDARY_CHARTS)) <= MAX_MINING_CHARTS
    for report in reports:  # everything the miner measured is declared
        assert undeclared(set(report.metrics), kinds=("chart", "table")) == []
    table = read_refresh_table(client, run_id)
    assert [(row["step"], row["plan_version"]) for row in table] == [(0, 1.0), (12, 2.0)]
    for row, report in zip(table, reports, strict=True):  # one row per refresh, every value
        measured = {k.removeprefix("mining/"): v for k, v in report.metrics.items()}
        assert row == pytest.approx({"step": row["step"], **measured}, rel=TABLE_ROUNDING)
    history = client.get_metric_history(run_id, "mining/total_s")
    assert sorted((m.step, m.value) for m in history) == [
        (r["step"], pytest.approx(r["total_s"], rel=TABLE_ROUNDING)) for r in table
    ]
    assert MINING_TABLE in [a.path for a in client.list_artifacts(run_id, "mining")]
    _assert_one_column_per_refresh(client, run_id, table)


def _assert_one_column_per_refresh(client, run_id, table):
    """What the artifact view shows: one row per diagnostic, one column per refresh, values a
    reviewer reads at a glance, drawn as a table (the tag MLflow's UI reads)."""
    raw = json.loads(Path(client.download_artifacts(run_id, MINING_TABLE, tempfile.mkdtemp())).read_text())
    assert raw["columns"] == ["diagnostic"] + [f"v{r['plan_version']:g} @ step {r['step']:g}" for r in table]
    names = [row[0] for row in raw["data"]]
    assert names[:2] == ["step", "plan_version"] and len(names) == len(set(names))
    # the rest in the catalogue's order: the same row in the same place in every run
    positions = [CATALOGUE.index(spec_for(f"mining/{name}")) for name in names[2:]]
    assert positions == sorted(positions)
    assert set(names) == set().union(*table)
    for row in raw["data"]:
        for value in row[1:]:
            if isinstance(value, float):
                assert len(f"{value:e}".split("e")[0].replace(".", "").rstrip("0")) <= 4, row
    logged = json.loads(client.get_run(run_id).data.tags[MLFLOW_LOGGED_ARTIFACTS])
    assert {"path": MINING_TABLE, "type": "table"} in logged


def test_neighbourhood_refresh_charts_a_few_keys_and_tables_the_rest(
    tmp_path, tiny_model_dir, tokenized_corpus, ray_local
):
    client, run_id, reports = _refresh_twice(tmp_path, tiny_model_dir, tokenized_corpus[0])
    _assert_charts_and_table(client, run_id, reports)
    assert "mining/batch_similarity_mean" in client.get_run(run_id).data.metrics


def test_pair_refresh_charts_a_few_keys_and_tables_the_rest(
    tmp_path, tiny_model_dir, paraphrase_pairs, ray_local
):
    from pipeline.data.normalize import with_text_keys
    from pipeline.data.tokenize import tokenize_table
    from pipeline.data.triplets import index_triplets
    from pipeline.model.folders import load_tokenizer

    table, triplets = index_triplets(*paraphrase_pairs, None)
    tokenized = with_text_keys(tokenize_table(table, load_tokenizer(tiny_model_dir), 32))
    client, run_id, reports = _refresh_twice(tmp_path, tiny_model_dir, tokenized, triplets)
    _assert_charts_and_table(client, run_id, reports)
    assert "mining/selected" in client.get_run(run_id).data.metrics


def test_refresh_table_keeps_a_resent_refresh_once(tmp_path):
    """An upload retried after the server took it sends the refresh twice; the table holds it
    once, and a value a refresh lacks stays empty."""
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlruns.db'}")
    experiment = client.create_experiment("resent", artifact_location=str(tmp_path / "artifacts"))
    run_id = client.create_run(experiment).info.run_id
    assert read_refresh_table(client, run_id) == []
    for refresh in ({"step": 0, "plan_version": 1, "kept": 5.0},) * 2 + (
        {"step": 9, "plan_version": 2, "kept": 7.0, "churn": 0.123456},
    ):
        add_refresh(client, run_id, refresh)
    assert read_refresh_table(client, run_id) == [
        {"step": 0.0, "plan_version": 1.0, "kept": 5.0},
        {"step": 9.0, "plan_version": 2.0, "kept": 7.0, "churn": 0.1235},
    ]
    _assert_one_column_per_refresh(client, run_id, read_refresh_table(client, run_id))
