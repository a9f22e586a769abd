"""Retrieval evaluation sets (``eval.retrieval``, ``jobs/evaluate.py --retrieval``): queries, a
corpus and which documents are relevant to each query.

Two forms are read:

- **BEIR folder**: ``queries.jsonl`` (``_id``, ``text``), ``corpus.jsonl`` (``_id``, ``text``,
  optional ``title``, prepended with a space when not empty) and ``qrels/<split>.tsv``
  (``query-id``, ``corpus-id``, ``score``; a header row). The split is ``qrels/dev.tsv``, else
  the only ``.tsv`` there; ``FOLDER#SPLIT`` names another. The queries are those the qrels
  judge (BEIR's own rule), the corpus is every document.
- **pair file**: ``sentence1``, ``sentence2``, ``label`` (1: relevant/paraphrase, 0: not) as a
  headerless tab-separated ``.tsv`` read with quoting off (texts contain ``"``; a first line
  ``sentence1<TAB>sentence2<TAB>label`` is taken as a header), or ``.csv`` / ``.jsonl`` /
  ``.parquet`` with those columns. The queries are the distinct ``sentence1`` of label-1
  rows, each query's relevant documents its label-1 partners, and the corpus every distinct
  ``sentence2`` of the file, whatever its label.

Both forms of the same data give the same set, hence the same scores.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from pipeline.core.errors import DataError
from pipeline.evaluation.set_names import with_distinct_names

BEIR_FILES = ("queries.jsonl", "corpus.jsonl")
PAIR_SUFFIXES = (".tsv", ".csv", ".jsonl", ".parquet")
PAIR_COLUMNS = ("sentence1", "sentence2", "label")


@dataclass
class RetrievalSet:
    """One retrieval set as read: texts, and the graded relevance of documents to queries."""

    name: str
    """Short name for tables and metric keys: the folder's (``_<split>`` when named) or file's stem."""
    path: str
    format: str
    """``beir`` or ``pairs``."""
    queries: list[str]
    """Query texts (the judged queries only)."""
    docs: list[str]
    """Corpus texts, one per document (a text may occur twice in a BEIR corpus)."""
    relevance: list[dict[int, float]]
    """Per query: document index -> grade (> 0 relevant; pair files: 1)."""
    unjudged: int = 0
    """BEIR queries the qrels name no document for: not scored, counted as skipped."""


def read_retrieval_sets(specs: list[str]) -> list[RetrievalSet]:
    """Read every set, giving repeated names a numeric suffix (``dev``, ``dev_2``)."""
    return with_distinct_names([read_retrieval_set(spec) for spec in specs])


def read_retrieval_set(spec: str) -> RetrievalSet:
    """A BEIR folder (``FOLDER`` or ``FOLDER#SPLIT``) or a pair file.

    Raises:
        DataError: one line naming the file (and line) that is missing or malformed.
    """
    path = Path(spec)
    split = None
    if not path.exists() and "#" in spec:
        folder, split = spec.rsplit("#", 1)
        path = Path(folder)
        if not path.is_dir():
            raise DataError(f"retrieval set not found: {folder} is not a folder")
    if path.is_dir():
        return _read_beir(path, split)
    if not path.is_file():
        raise DataError(f"retrieval set not found: {spec}")
    if path.suffix.lower() not in PAIR_SUFFIXES:
        raise DataError(
            f"{path}: a retrieval set is a BEIR folder or a pair file ({', '.join(PAIR_SUFFIXES)})"
        )
    return _read_pair_file(path)


# --- BEIR -------------------------------------------------------------------------------------


def _read_beir(folder: Path, split: str | None) -> RetrievalSet:
    for name in BEIR_FILES:
        if not (folder / name).is_file():
            raise DataError(f"{folder}: not a BEIR folder, no {name}")
    qrels = _qrels_file(folder, split)
    query_text = _jsonl_texts(folder / "queries.jsonl", with_title=False)
    doc_text = _jsonl_texts(folder / "corpus.jsonl", with_title=True)
    doc_index = {doc_id: i for i, doc_id in enumerate(doc_text)}
    judged: dict[str, dict[int, float]] = {}  # query id -> {document index: grade}, qrels order
    for line_no, fields in _tsv_rows(qrels):
        if line_no == 1 and fields[:2] == ["query-id", "corpus-id"]:
            continue
        if len(fields) != 3:
            raise DataError(
                f"{qrels}:{line_no}: qrels rows are query-id<TAB>corpus-id<TAB>score (got {len(fields)} fields)"
            )
        query_id, doc_id, score = fields
        if query_id not in query_text:
            raise DataError(f"{qrels}:{line_no}: query id {query_id!r} is not in queries.jsonl")
        if doc_id not in doc_index:
            raise DataError(f"{qrels}:{line_no}: corpus id {doc_id!r} is not in corpus.jsonl")
        judged.setdefault(query_id, {})[doc_index[doc_id]] = _number(score, qrels, line_no, "score")
    name = folder.resolve().name + (f"_{split}" if split else "")
    return RetrievalSet(
        name=name,
        path=str(folder) + (f"#{split}" if split else ""),
        format="beir",
        queries=[query_text[q] for q in judged],
        docs=list(doc_text.values()),
        relevance=list(judged.values()),
        unjudged=len(query_text) - len(judged),
    )


def _qrels_file(folder: Path, split: str | None) -> Path:
    qrels = folder / "qrels"
    if split is not None:
        chosen = qrels / f"{split}.tsv"
        if not chosen.is_file():
            raise DataError(f"{folder}: no qrels/{split}.tsv")
        return chosen
    if (qrels / "dev.tsv").is_file():
        return qrels / "dev.tsv"
    found = sorted(qrels.glob("*.tsv")) if qrels.is_dir() else []
    if len(found) == 1:
        return found[0]
    if not found:
        raise DataError(f"{folder}: not a BEIR folder, no qrels/*.tsv")
    names = ", ".join(p.stem for p in found)
    raise DataError(f"{folder}: several qrels splits ({names}) and no dev.tsv; name one as {folder}#SPLIT")


def _jsonl_texts(path: Path, with_title: bool) -> dict[str, str]:
    """``_id`` -> text of each record (``title text`` when ``with_title`` and a title is set)."""
    texts: dict[str, str] = {}
    for line_no, record in _jsonl_records(path):
        for key in ("_id", "text"):
            if key not in record:
                raise DataError(f"{path}:{line_no}: no key {key!r}")
        record_id = str(record["_id"])
        if record_id in texts:
            raise DataError(f"{path}:{line_no}: id {record_id!r} repeated")
        title = str(record.get("title") or "") if with_title else ""
        texts[record_id] = f"{title} {record['text']}" if title else str(record["text"])
    return texts


# --- pair files -------------------------------------------------------------------------------


def _read_pair_file(path: Path) -> RetrievalSet:
    suffix = path.suffix.lower()
    rows = {
        ".tsv": _tsv_pairs,
        ".csv": _csv_pairs,
        ".jsonl": _jsonl_pairs,
        ".parquet": _parquet_pairs,
    }[suffix](path)
    query_index: dict[str, int] = {}
    doc_index: dict[str, int] = {}
    relevance: list[dict[int, float]] = []
    for line_no, s1, s2, label in rows:
        value = _number(label, path, line_no, "label")
        if value not in (0.0, 1.0):
            raise DataError(f"{path}:{line_no}: label {label!r} is not 0 or 1")
        doc = doc_index.setdefault(str(s2), len(doc_index))
        if value == 1.0:
            query = query_index.setdefault(str(s1), len(query_index))
            if query == len(relevance):
                relevance.append({})
            relevance[query][doc] = 1.0
    if not doc_index:
        raise DataError(f"{path}: no sentence pairs in it")
    return RetrievalSet(
        name=path.stem,
        path=str(path),
        format="pairs",
        queries=list(query_index),
        docs=list(doc_index),
        relevance=relevance,
    )


PairRow = tuple[int, Any, Any, Any]
"""(line or row number, sentence1, sentence2, label)."""


def _tsv_pairs(path: Path) -> Iterator[PairRow]:
    for line_no, fields in _tsv_rows(path):
        if line_no == 1 and fields == list(PAIR_COLUMNS):
            continue  # a header row
        if len(fields) != 3:
            raise DataError(
                f"{path}:{line_no}: pair rows are sentence1<TAB>sentence2<TAB>label, no quoting "
                f"(got {len(fields)} fields)"
            )
        yield line_no, fields[0], fields[1], fields[2]


def _missing_column(path: Path, columns: list[str], where: str = "") -> DataError:
    missing = next(c for c in PAIR_COLUMNS if c not in columns)
    return DataError(
        f"{path}{where}: no column {missing!r} (columns: {', '.join(columns) or 'none'}); "
        f"pair files need {', '.join(PAIR_COLUMNS)}"
    )


def _csv_pairs(path: Path) -> Iterator[PairRow]:
    with path.open(encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle)
        columns = list(reader.fieldnames or [])
        if not set(PAIR_COLUMNS) <= set(columns):
            raise _missing_column(path, columns)
        for record in reader:
            yield reader.line_num, record["sentence1"], record["sentence2"], record["label"]


def _jsonl_pairs(path: Path) -> Iterator[PairRow]:
    for line_no, record in _jsonl_records(path):
        if not set(PAIR_COLUMNS) <= set(record):
            raise _missing_column(path, list(record), f":{line_no}")
        yield line_no, record["sentence1"], record["sentence2"], record["label"]


def _parquet_pairs(path: Path) -> Iterator[PairRow]:
    try:
        table = pq.read_table(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a bad file
        raise DataError(f"{path}: not a parquet file ({str(exc).splitlines()[0]})") from None
    if not set(PAIR_COLUMNS) <= set(table.column_names):
        raise _missing_column(path, table.column_names)
    columns = [table.column(c).to_pylist() for c in PAIR_COLUMNS]
    for row, (s1, s2, label) in enumerate(zip(*columns, strict=True), 1):
        yield row, s1, s2, label


# --- shared line readers ----------------------------------------------------------------------


def _tsv_rows(path: Path) -> Iterator[tuple[int, list[str]]]:
    """``(line number, fields)`` of each non-blank line, split on tabs with no quote handling."""
    try:
        with path.open(encoding="utf-8") as handle:
            for line_no, line in enumerate(handle, 1):
                if line.strip():
                    yield line_no, line.rstrip("\r\n").split("\t")
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not UTF-8 ({exc.reason} at byte {exc.start})") from None


def _jsonl_records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        with path.open(encoding="utf-8") as handle:
            for line_no, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DataError(f"{path}:{line_no}: not a JSON object ({exc.msg})") from None
                if not isinstance(record, dict):
                    raise DataError(f"{path}:{line_no}: not a JSON object")
                yield line_no, record
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not UTF-8 ({exc.reason} at byte {exc.start})") from None


def _number(text: Any, path: Path, line_no: int, what: str) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = float("nan")
    if not math.isfinite(value):
        raise DataError(f"{path}:{line_no}: {what} {text!r} is not a number")
    return value
