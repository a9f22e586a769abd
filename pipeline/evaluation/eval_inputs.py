"""The evaluation sets as MLflow dataset inputs (context ``eval``): what a reviewer opens to see
which data a run's ``eval/`` scores come from, with a fingerprint to tell two copies apart."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from pipeline.evaluation.retrieval_sets import RetrievalSet
from pipeline.evaluation.sts import STSPairs
from pipeline.tracking.context import InputDataset

STS_SCHEMA = {"sentence1": "string", "sentence2": "string", "score": "double"}
RETRIEVAL_SCHEMA = {"query": "string", "document": "string", "relevance": "double"}
"""A retrieval set as judged pairs (BEIR's queries, corpus and qrels, or a pair file)."""


def eval_datasets(sts_files: list[STSPairs], retrieval_sets: list[RetrievalSet]) -> list[InputDataset]:
    """One dataset input per STS file (rows: its pairs) and per retrieval set (rows: its
    judged queries; documents in the profile), named as their ``eval/`` metrics name them."""
    sts = [
        InputDataset(
            source=f.path,
            digest=_sts_digest(f),
            rows=len(f),
            kind="sts",
            columns=STS_SCHEMA,
            context="eval",
            name=f.name,
        )
        for f in sts_files
    ]
    retrieval = [
        InputDataset(
            source=s.path,
            digest=_retrieval_digest(s),
            rows=len(s.queries),
            kind="retrieval",
            columns=RETRIEVAL_SCHEMA,
            context="eval",
            name=s.name,
            profile={"documents": len(s.docs)},
        )
        for s in retrieval_sets
    ]
    return sts + retrieval


def _sts_digest(f: STSPairs) -> str:
    return _digest(zip(f.sentences1, f.sentences2, map(repr, f.scores.tolist()), strict=True))


def _retrieval_digest(s: RetrievalSet) -> str:
    """Its queries, documents and judgements (query position, document position, grade)."""
    judgements = (
        (str(i), str(doc), repr(grade))
        for i, judged in enumerate(s.relevance)
        for doc, grade in sorted(judged.items())
    )
    return _digest([*((q,) for q in s.queries), *((d,) for d in s.docs), *judgements])


def _digest(records: Iterable[tuple[str, ...]]) -> str:
    """16 hex digits of a hash of the records in order (fields and records kept apart by
    separators that text cells do not hold)."""
    digest = hashlib.blake2b(digest_size=8)
    for record in records:
        digest.update("\x1f".join(record).encode("utf-8", "surrogatepass") + b"\x1e")
    return digest.hexdigest()
