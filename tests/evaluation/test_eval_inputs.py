"""The datasets a run read, as a reviewer meets them in MLflow's dataset drawer: the evaluation
sets under context ``eval`` and the training data with its schema, logged to a real sqlite store."""

from __future__ import annotations

import json

import numpy as np
from mlflow.tracking import MlflowClient

from pipeline.config.data_section import DataSection
from pipeline.data.columns import input_schema
from pipeline.evaluation.eval_inputs import eval_datasets
from pipeline.evaluation.retrieval_sets import RetrievalSet
from pipeline.evaluation.sts import STSPairs
from pipeline.tracking.context import InputDataset, log_datasets
from pipeline.tracking.run import TrackedRun


def _sts(name: str, scores: list[float]) -> STSPairs:
    return STSPairs(
        name, f"/data/{name}.tsv", "stsb", ["a cat", "a dog"], ["the cat", "a car"], np.array(scores)
    )


def _retrieval(name: str, grade: float) -> RetrievalSet:
    return RetrievalSet(
        name, f"/data/{name}", "beir", ["q one", "q two"], ["d0", "d1", "d2"], [{0: grade}, {2: 1.0}]
    )


def test_eval_sets_are_logged_as_eval_datasets_with_their_schema(tmp_path):
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlruns.db'}")
    experiment = client.create_experiment("inputs", artifact_location=str(tmp_path / "artifacts"))
    run_id = client.create_run(experiment).info.run_id
    training = InputDataset(
        source="/data/pairs.csv", digest="0123456789abcdef", rows=7, kind="pairs",
        columns=input_schema(DataSection(format="csv", label_column="label"), pairs=True),
    )  # fmt: skip
    evaluated = eval_datasets([_sts("stsb-dev", [4.0, 1.0])], [_retrieval("twitter", 1.0)])
    tracked = TrackedRun(client, client.tracking_uri, run_id, experiment, resumed=False)
    log_datasets(tracked, [training, *evaluated])

    inputs = {d.dataset.name: d for d in client.get_run(run_id).inputs.dataset_inputs}
    assert set(inputs) == {"pairs.csv", "stsb-dev", "twitter"}
    context = {name: {t.key: t.value for t in d.tags}["mlflow.data.context"] for name, d in inputs.items()}
    assert context == {"pairs.csv": "training", "stsb-dev": "eval", "twitter": "eval"}
    schema = {name: json.loads(d.dataset.schema)["mlflow_colspec"] for name, d in inputs.items()}
    assert [(c["name"], c["type"]) for c in schema["pairs.csv"]] == [
        ("anchor", "string"), ("positive", "string"), ("label", "long"),
    ]  # fmt: skip
    assert [c["name"] for c in schema["stsb-dev"]] == ["sentence1", "sentence2", "score"]
    profiles = {name: json.loads(d.dataset.profile) for name, d in inputs.items()}
    assert profiles["stsb-dev"]["num_rows"] == 2 and profiles["twitter"] == {
        "num_rows": 2, "kind": "retrieval", "documents": 3,
    }  # fmt: skip
    assert json.loads(inputs["twitter"].dataset.source) == {"uri": "/data/twitter"}


def test_an_eval_digest_follows_the_content_not_the_name():
    (same,) = eval_datasets([_sts("a", [4.0, 1.0])], [])
    (renamed,) = eval_datasets([_sts("b", [4.0, 1.0])], [])
    (rescored,) = eval_datasets([_sts("a", [4.0, 1.5])], [])
    assert same.digest == renamed.digest != rescored.digest and len(same.digest) == 16
    graded, regraded = (eval_datasets([], [_retrieval("r", g)])[0].digest for g in (1.0, 2.0))
    assert graded != regraded


def test_the_training_schema_names_the_columns_the_job_reads():
    assert input_schema(DataSection(format="text"), pairs=False) == {"text": "string"}
    assert input_schema(DataSection(format="jsonl", text_column="body"), pairs=False) == {"body": "string"}
    assert input_schema(DataSection(format="pairs_tsv"), pairs=True) == {
        "sentence1": "string",
        "sentence2": "string",
    }
    section = DataSection(format="parquet", anchor_column="q", positive_column="d", negative_column="n")
    assert input_schema(section, pairs=True) == {"q": "string", "d": "string", "n": "string"}
