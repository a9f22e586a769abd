"""The ``eval`` section: the STS files and retrieval sets evaluated during training, and the
metric that picks the exported model (``select_by``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.config.check import Check


@dataclass
class EvalSection:
    sts: list[str] = field(default_factory=list)
    """STS files evaluated at the start, at every epoch end and every ``every_steps`` (Spearman
    x 100 of cosine similarity). The first one picks the best checkpoint, which is what the
    job exports. Empty: no evaluation, and the last epoch is exported. Files are told apart by
    name and first line: the STS-B release, CNSD, or csv/tsv/jsonl with ``sentence1``,
    ``sentence2``, ``score``. A pair whose gold score is at least 0.8 x the scale's top (4 on
    0-5, 0.8 on 0-1) is a positive: for alignment and paraphrase retrieval."""
    every_steps: int = 0
    """Also evaluate every N optimizer steps. Any evaluation can pick the exported model, not
    only epoch ends. 0: off."""
    retrieval: list[str] = field(default_factory=list)
    """Retrieval sets evaluated with the STS files (nDCG@10, MRR@10, Recall@1/@10/@100 x 100 of
    cosine similarity, logged as ``eval/retrieval_<set>_ndcg_at_10`` ...): BEIR folders
    (``queries.jsonl``, ``corpus.jsonl``, ``qrels/dev.tsv`` or the only ``qrels/*.tsv``;
    ``FOLDER#SPLIT`` names another) or pair files (``sentence1``, ``sentence2``, ``label`` 0/1:
    a headerless unquoted ``.tsv``, or ``.csv``/``.jsonl``/``.parquet``). Without ``eval.sts``
    the first set's nDCG@10 picks the exported model."""
    select_by: str | None = None
    """The metric that picks the exported model, as logged without ``eval/``:
    ``sts_<file>_{spearman,mrr_at_10,recall_at_1}`` or
    ``retrieval_<set>_{ndcg_at_10,mrr_at_10,recall_at_1,recall_at_10,recall_at_100}``
    (higher is better). ``None``: the first STS file's Spearman, else the first retrieval set's
    nDCG@10."""
    patience: int = 0
    """Early stopping: end the run at the first epoch end where the last ``patience``
    evaluations (epoch ends, and every ``every_steps``) did not beat the best ``select_by``
    score so far; the best model is exported as always. 0: train every epoch. Needs an
    evaluation (``eval.sts`` or ``eval.retrieval``)."""

    def checks(self) -> list[Check]:
        """This section's rules (see :data:`Check`)."""
        return [
            ("eval.every_steps", self.every_steps >= 0, "must be >= 0"),
            ("eval.patience", self.patience >= 0, "must be >= 0 (0: no early stopping)"),
            ("eval.retrieval", all(p.strip() for p in self.retrieval), "must not hold an empty path"),
            (
                "eval.select_by",
                self.select_by is None or _selectable(self.select_by),
                "must name a metric: sts_<file>_{"
                + ",".join(SELECTABLE_METRICS["sts"])
                + "} or retrieval_<set>_{"
                + ",".join(SELECTABLE_METRICS["retrieval"])
                + "}",
            ),
            (
                "eval.select_by",
                not (self.select_by or "").startswith("retrieval_") or bool(self.retrieval),
                "names a retrieval metric but eval.retrieval is empty",
            ),
        ]


SELECTABLE_METRICS = {
    "sts": ("spearman", "mrr_at_10", "recall_at_1"),
    "retrieval": ("ndcg_at_10", "mrr_at_10", "recall_at_1", "recall_at_10", "recall_at_100"),
}
"""The metrics ``eval.select_by`` may name, per kind of set (higher is better for each)."""


def _selectable(name: str) -> bool:
    """Whether ``name`` has the form of a selectable metric: ``<kind>_<set>_<metric>``."""
    return any(
        name.startswith(f"{kind}_")
        and name.endswith(f"_{metric}")
        and len(name) > len(kind) + len(metric) + 2
        for kind, metrics in SELECTABLE_METRICS.items()
        for metric in metrics
    )
