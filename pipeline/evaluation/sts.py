"""STS (semantic textual similarity) files and Spearman's rank correlation.

Formats read:

- ``stsb``: the original STS Benchmark release. Tab-separated, no header, no quoting (sentences
  contain ``"``), columns genre, file, year, id, score, sentence1, sentence2, and on some rows
  extra trailing columns that are ignored.
- ``cnsd``: the Chinese STS-B, ``id||sentence1||sentence2||score`` (ids repeat; rows are
  identified by line number).
- ``csv`` / ``tsv`` / ``jsonl``: a header (or keys) with ``sentence1``, ``sentence2``, ``score``.

``auto`` (what the jobs use) tells them apart by name and first line: ``.jsonl``/``.json`` or a
first line that opens a JSON object mean JSON lines, ``||`` fields mean CNSD, a tab-separated
``sentence1`` header means tsv (whatever the extension), seven or more other tab fields mean
STS-B, anything else is a header row (tab-separated for ``.tsv``, else comma-separated).

Gold scores keep the file's scale; a pair is a positive (for alignment and paraphrase
retrieval) from :data:`POSITIVE_SHARE_OF_SCALE` of the scale's top (:attr:`STSPairs.positive_threshold`).
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.core.errors import DataError

STS_FORMATS = ("auto", "stsb", "cnsd", "csv", "tsv", "jsonl")
COLUMNS = ("sentence1", "sentence2", "score")
POSITIVE_SHARE_OF_SCALE = 0.8
"""A pair is a positive from this share of its scale's top: 4 on the 0-5 scale of STS-B and CNSD
(SimCSE's alignment threshold), 0.8 on the 0-1 scale of normalised copies."""


@dataclass
class STSPairs:
    """Sentence pairs with gold similarity scores, as read from one file."""

    name: str
    """Short name for tables and metric keys (the file name without extension)."""
    path: str
    format: str
    sentences1: list[str]
    sentences2: list[str]
    scores: np.ndarray
    """Gold scores, float64, shape ``(pairs,)``."""

    def __len__(self) -> int:
        return len(self.scores)

    @property
    def scale_top(self) -> float:
        """The top of the gold scale: 1 when every score is within 1 (normalised copies such as
        sentence-transformers' stsb), 5 when within 5 (STS-B, CNSD, SICK-R), else the highest
        score."""
        highest = float(self.scores.max())
        return 1.0 if highest <= 1 else 5.0 if highest <= 5 else highest

    @property
    def positive_threshold(self) -> float:
        """Gold score from which a pair is a positive: 4 on the 0-5 scale."""
        return POSITIVE_SHARE_OF_SCALE * self.scale_top


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation of two equally long vectors (ties get their average rank).

    Returns a float in [-1, 1]; NaN when either input is constant.
    """
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"spearman needs two vectors of one length (got {x.shape} and {y.shape})")
    rx, ry = _average_ranks(x), _average_ranks(y)
    rx -= rx.mean()
    ry -= ry.mean()
    denominator = math.sqrt(float(rx @ rx) * float(ry @ ry))
    return float(rx @ ry) / denominator if denominator > 0 else float("nan")


def _average_ranks(values: np.ndarray) -> np.ndarray:
    order = np.argsort(values, kind="mergesort")
    ordered = values[order]
    starts = np.r_[0, np.flatnonzero(np.diff(ordered)) + 1]
    ends = np.r_[starts[1:], len(values)]
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)  # 1-based average rank
    return ranks


def detect_format(path: Path) -> str:
    """The format of an STS file, from its name and first non-blank line."""
    if path.suffix.lower() in (".jsonl", ".json"):
        return "jsonl"
    with path.open(encoding="utf-8", errors="replace") as handle:
        first = next((line for line in handle if line.strip()), "")
    if first.lstrip().startswith("{"):
        return "jsonl"
    if first.count("||") >= 3:
        return "cnsd"
    fields = first.rstrip("\r\n").split("\t")
    if "sentence1" in fields:
        return "tsv"  # a tab-separated header, whatever the extension
    if len(fields) >= 7:
        return "stsb"  # whatever the extension: the original release is sts-*.csv
    return "tsv" if path.suffix.lower() == ".tsv" else "csv"


def read_sts(path: str | Path, format: str = "auto") -> STSPairs:
    """Read one STS file.

    Raises:
        DataError: missing file, unknown format, or a malformed row (named by line number).
    """
    p = Path(path)
    if not p.is_file():
        raise DataError(f"STS file not found: {p}")
    if format not in STS_FORMATS:
        raise DataError(f"unknown STS format {format!r} for {p} (one of {', '.join(STS_FORMATS)})")
    fmt = detect_format(p) if format == "auto" else format
    try:
        rows = {
            "stsb": _read_stsb,
            "cnsd": _read_cnsd,
            "csv": _read_delimited,
            "tsv": _read_delimited,
            "jsonl": _read_jsonl,
        }[fmt](p, fmt)
    except UnicodeDecodeError as exc:
        raise DataError(f"{p}: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    if not rows:
        raise DataError(f"{p}: no sentence pairs in it (read as {fmt})")
    s1, s2, scores = zip(*rows, strict=True)
    return STSPairs(p.stem, str(p), fmt, list(s1), list(s2), np.asarray(scores, dtype=np.float64))


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def _score(text: str, p: Path, line: int) -> float:
    if not _is_number(str(text).strip()):
        raise DataError(f"{p}:{line}: score {text!r} is not a number")
    return float(text)


def _nonblank_lines(p: Path) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` for each line of a UTF-8 file that holds more than white space."""
    with p.open(encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, 1):
            if line.strip():
                yield line_no, line


def _read_stsb(p: Path, _fmt: str) -> list[tuple[str, str, float]]:
    rows = []
    for line_no, line in _nonblank_lines(p):
        fields = line.rstrip("\r\n").split("\t")  # no quote handling: sentences contain '"'
        if len(fields) < 7:
            raise DataError(f"{p}:{line_no}: STS-B rows need 7 tab-separated fields (got {len(fields)})")
        rows.append((fields[5], fields[6], _score(fields[4], p, line_no)))
    return rows


def _read_cnsd(p: Path, _fmt: str) -> list[tuple[str, str, float]]:
    rows = []
    for line_no, line in _nonblank_lines(p):
        fields = line.rstrip("\r\n").split("||")
        if len(fields) != 4:
            raise DataError(
                f"{p}:{line_no}: CNSD rows are id||sentence1||sentence2||score (got {len(fields)} fields)"
            )
        rows.append((fields[1], fields[2], _score(fields[3], p, line_no)))
    return rows


def _read_delimited(p: Path, fmt: str) -> list[tuple[str, str, float]]:
    rows = []
    with p.open(encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle, delimiter="\t" if fmt == "tsv" else ",")
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise DataError(
                f"{p}: no column {missing[0]!r} (columns: {', '.join(reader.fieldnames or []) or 'none'}); "
                f"{fmt} STS files need a header with {', '.join(COLUMNS)}"
            )
        for record in reader:
            rows.append(
                (record["sentence1"], record["sentence2"], _score(record["score"], p, reader.line_num))
            )
    return rows


def _read_jsonl(p: Path, _fmt: str) -> list[tuple[str, str, float]]:
    rows = []
    for line_no, line in _nonblank_lines(p):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{p}:{line_no}: not a JSON object ({exc.msg})") from None
        missing = [c for c in COLUMNS if c not in record]
        if missing:
            raise DataError(f"{p}:{line_no}: no key {missing[0]!r}")
        rows.append((str(record["sentence1"]), str(record["sentence2"]), _score(record["score"], p, line_no)))
    return rows
