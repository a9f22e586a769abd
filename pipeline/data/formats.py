"""Input formats and where inputs live: the format a path's extension names, the pyarrow
filesystem of a local path or URI, and which formats hold sentences.
"""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.fs as pafs

from pipeline.core.errors import DataError

_EXTENSIONS = {
    ".txt": "text",
    ".text": "text",
    ".csv": "csv",
    ".tsv": "tsv",
    ".jsonl": "jsonl",
    ".json": "jsonl",
    ".parquet": "parquet",
    ".pq": "parquet",
}


def infer_format(path: str, configured: str, key: str = "data.format") -> str:
    """``configured`` unless it is ``auto``; then the format the path's extension names.
    ``pairs_tsv`` is never inferred: a ``.tsv`` file has a header unless the config says not."""
    if configured != "auto":
        return configured
    base = path.rstrip("/")
    for suffix in (".gz", ".bz2", ".zst"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
    ext = os.path.splitext(base)[1].lower()
    if ext in _EXTENSIONS:
        return _EXTENSIONS[ext]
    raise DataError(
        f"{key}: cannot tell the format of {path!r} from its extension; "
        f"set {key} to text, csv, tsv, jsonl, parquet or pairs_tsv"
    )


def filesystem_of(path: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem and its inner path for a local path or any URI pyarrow knows."""
    try:
        return pafs.FileSystem.from_uri(path)
    except (pa.ArrowInvalid, ValueError):
        return pafs.LocalFileSystem(), os.path.abspath(path)


def require_sentence_format(fmt: str) -> None:
    """The unsupervised corpus is sentences: a pair format is a config mistake."""
    if fmt == "pairs_tsv":
        raise DataError(
            "data.format: pairs_tsv holds (sentence1, sentence2[, label]) pairs, which only "
            "task: pairs (or jobs/mine.py) reads; sentences are text, csv, "
            "tsv, jsonl or parquet"
        )
