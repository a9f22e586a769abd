"""Retrieval beside STS in the train loop's evaluator (one process, no Ray): what it logs, what
picks the exported model (``eval.select_by``), and the config checks of the two keys."""

from __future__ import annotations

import math

import pytest
import torch
from test_retrieval_sets import ROWS, _write_beir, _write_pairs_tsv

from pipeline.config.eval_section import EvalSection
from pipeline.config.loading import load_config
from pipeline.core.errors import ConfigError
from pipeline.evaluation.in_training import (
    EvalOutcome,
    TrainingEvaluator,
    check_eval_sets,
    eval_metric_names,
)
from pipeline.evaluation.retrieval_scoring import RetrievalEvalSet, RetrievalSetScore
from pipeline.evaluation.retrieval_sets import read_retrieval_sets
from pipeline.evaluation.scoring import STSEvalSet, STSScore
from pipeline.evaluation.sts import read_sts
from pipeline.model.encoder import load_sentence_encoder
from pipeline.model.folders import load_tokenizer


def _retrieval_score(name: str, ndcg: float) -> RetrievalSetScore:
    return RetrievalSetScore(3, 0, 8, ndcg, 50.0, 10.0, 60.0, 100.0, name=name, path=name)


def test_selection_score_default_and_select_by():
    sts = STSScore("dev", 10, spearman=70.0, alignment=0.3, uniformity=-2.0)
    retrieval = [_retrieval_score("beir", 81.0), _retrieval_score("pairs", 82.0)]
    assert EvalOutcome([sts], retrieval).selection_score == 70.0  # the first STS file, as before
    assert EvalOutcome([], retrieval).selection_score == 81.0  # retrieval only: first set's nDCG@10
    chosen = EvalOutcome([sts], retrieval, select_by="retrieval_pairs_ndcg_at_10")
    assert chosen.selection_score == 82.0
    assert chosen.metrics()["eval_score"] == 82.0
    logged = eval_metric_names(chosen.metrics())  # the selection score is not a series of its own
    assert "eval/score" not in logged and logged["eval/retrieval_pairs_ndcg_at_10"] == 82.0
    assert logged["eval/sts_dev_spearman"] == 70.0
    assert {k for k in logged if k.startswith("eval/retrieval_beir_")} == {
        f"eval/retrieval_beir_{m}"
        for m in ("ndcg_at_10", "mrr_at_10", "recall_at_1", "recall_at_10", "recall_at_100")
    }
    assert "beir ndcg@10 81.00, mrr@10 50.00" in chosen.describe()
    assert chosen.describe().startswith("dev spearman 70.00, alignment 0.300, uniformity -2.000; ")
    assert math.isnan(EvalOutcome([sts], [], select_by="sts_other_spearman").selection_score)


def test_retrieval_only_evaluator_scores_the_live_model(tmp_path, tiny_model_dir):
    sets = read_retrieval_sets(
        [str(_write_beir(tmp_path / "beir")), str(_write_pairs_tsv(tmp_path / "pairs.tsv"))]
    )
    tokenizer = load_tokenizer(tiny_model_dir)
    eval_set = RetrievalEvalSet(sets, tokenizer, 32)
    model = load_sentence_encoder(tiny_model_dir, pooler="mean")
    section = EvalSection(retrieval=[s.path for s in sets], select_by="retrieval_pairs_mrr_at_10")
    evaluator = TrainingEvaluator(
        section, None, rank=0, world=1, device=torch.device("cpu"), retrieval_set=eval_set
    )
    outcome = evaluator.evaluate(model)
    assert (
        outcome is not None
        and outcome.scores == []
        and [r.name for r in outcome.retrieval] == ["beir", "pairs"]
    )
    beir, pairs = outcome.retrieval
    assert beir.ndcg_at_10 == pytest.approx(pairs.ndcg_at_10)  # the same data in two forms
    assert outcome.selection_score == pairs.mrr_at_10
    assert outcome.metrics()["eval_score"] == pairs.mrr_at_10
    # beside an STS file: both scored in one evaluation, STS picking by default
    sts_path = tmp_path / "sts.tsv"
    sts_path.write_text(
        "".join(f"g\tf\t2020\t{i}\t{5.0 * label}\t{a}\t{b}\n" for i, (a, b, label) in enumerate(ROWS))
    )
    sts_set = STSEvalSet([read_sts(sts_path)], tokenizer, 32)
    both = TrainingEvaluator(
        EvalSection(),
        sts_set,
        rank=0,
        world=1,
        device=torch.device("cpu"),
        retrieval_set=eval_set,
    ).evaluate(model)
    assert both is not None and both.selection_score == both.scores[0].spearman
    assert both.retrieval[0].ndcg_at_10 == pytest.approx(beir.ndcg_at_10)


def test_config_keys_fail_with_one_line_naming_the_key(tmp_path):
    cfg = load_config(None, ["eval.retrieval=[a, b]", "eval.select_by=retrieval_b_ndcg_at_10"])
    assert cfg.eval.retrieval == ["a", "b"] and cfg.eval.select_by == "retrieval_b_ndcg_at_10"
    for override, message in [
        ("eval.select_by=best", "eval.select_by must name a metric: sts_<file>_{spearman,"),
        ("eval.select_by=sts_dev_alignment", "eval.select_by must name a metric"),  # lower is better
        (
            "eval.select_by=retrieval_dev_ndcg_at_10",
            "eval.select_by names a retrieval metric but eval.retrieval is empty",
        ),
    ]:
        with pytest.raises(ConfigError) as err:
            load_config(None, [override])
        assert str(err.value).startswith(message) and "\n" not in str(err.value)
    # against the sets really read
    check_eval_sets(EvalSection(select_by="sts_dev_spearman"), ["dev"], ["beir"])
    with pytest.raises(ConfigError) as err:
        check_eval_sets(EvalSection(select_by="retrieval_twitter_ndcg_at_10"), ["dev"], ["beir"])
    assert str(err.value).startswith(
        "eval.select_by: no metric 'retrieval_twitter_ndcg_at_10' among the evaluated sets (one of sts_dev_spearman,"
    )
