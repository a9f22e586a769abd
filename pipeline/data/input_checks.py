"""What a job checks of its inputs before Ray starts: the corpus (and pool) path exists, and
the first file's header, schema or leading records hold the columns the job reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.fs as pafs
import pyarrow.json as pajson
import pyarrow.parquet as pq

from pipeline.config.data_section import DataSection
from pipeline.core.errors import DataError
from pipeline.data.columns import corpus_columns, pair_columns, require_column_names
from pipeline.data.delimited import (
    csv_parse_options,
    csv_read_options,
    pairs_tsv_names,
    require_pairs_tsv_fields,
)
from pipeline.data.formats import filesystem_of, infer_format, require_sentence_format


def check_corpus_path(path: str, key: str = "data.path") -> None:
    """Fail fast, before Ray starts, when the corpus path (or the one ``key`` names) does not
    exist."""
    filesystem, inner = filesystem_of(path)
    try:
        info = filesystem.get_file_info(inner)
    except OSError as exc:
        raise DataError(f"{key}: cannot access {path}: {str(exc).splitlines()[0]}") from None
    if info.type == pafs.FileType.NotFound:
        raise DataError(f"{key}: {path} does not exist")


# Files Ray Data reads from a folder, by format (its read_json / read_parquet extension
# filters; read_csv reads every file). Compressed variants end in one of _COMPRESSIONS.
_FOLDER_SUFFIXES = {"jsonl": (".json", ".jsonl"), "parquet": (".parquet",)}


_COMPRESSIONS = ("", ".gz", ".br", ".zst", ".lz4")


def _first_file(filesystem: pafs.FileSystem, inner: str, fmt: str) -> str | None:
    """The file whose columns a read of ``inner`` starts with, or None when there is none
    to look at or it is not plain which.

    A folder is listed as Ray Data lists it: recursively, sorted, names starting with ``.``
    or ``_`` left out. An empty first file gives None (Ray's csv reader fails on it, in its
    own words), and so do hive-style ``key=value`` folders, which add columns from the path
    that a file's own header does not show.
    """
    info = filesystem.get_file_info(inner)
    if info.type == pafs.FileType.File:
        first = info
    elif info.type == pafs.FileType.Directory:
        root = inner.rstrip("/") + "/"
        suffixes = tuple(s + c for s in _FOLDER_SUFFIXES.get(fmt, ("",)) for c in _COMPRESSIONS)
        files = sorted(
            (
                child
                for child in filesystem.get_file_info(pafs.FileSelector(inner, recursive=True))
                if child.type == pafs.FileType.File
                and child.path.startswith(root)
                and not child.path[len(root) :].startswith((".", "_"))
                and child.path.lower().endswith(suffixes)
            ),
            key=lambda child: child.path,
        )
        if not files:
            return None
        first = files[0]
    else:
        return None
    if not first.size or any("=" in part for part in first.path.split("/")[:-1]):
        return None
    return first.path


def _jsonl_columns(stream: Any, wanted: Sequence[str]) -> list[str] | None:
    """The keys of a JSON-lines file in first-seen order, reading no more than needed.

    The first block (1 MiB) usually has every key. Only when a wanted key is not among
    them is the rest of the file streamed, since a key may first appear further down
    (rows without a given negative may leave that key out): a key new to the stream makes
    Arrow fail, and then the answer is None, not a missing column.
    """
    reader = pajson.open_json(stream)
    names = list(reader.schema.names)
    if all(column in names for column in wanted):
        return names
    try:
        for _ in reader:
            pass
    except pa.ArrowInvalid:
        return None
    return names


def _header_columns(path: str, fmt: str, wanted: Sequence[str]) -> list[str] | None:
    """The column names a Ray Data read of ``path`` starts with, from the first file's
    header (csv/tsv, parsed as :func:`~pipeline.data.readers.read_dataset` parses it;
    ``pairs_tsv``: the fields of its first line, named as the reader names them), schema
    (parquet) or records (jsonl); None when that cannot be told cheaply and surely."""
    filesystem, inner = filesystem_of(path)
    try:
        file = _first_file(filesystem, inner, fmt)
        if file is None:
            return None
        if fmt == "parquet":
            return list(pq.read_schema(file, filesystem=filesystem).names)
        with filesystem.open_input_stream(file) as stream:  # decompresses by extension
            if fmt == "jsonl":
                return _jsonl_columns(stream, wanted)

            reader = pacsv.open_csv(
                stream, read_options=csv_read_options(fmt), parse_options=csv_parse_options(fmt)
            )
            names = list(reader.schema.names)
            return pairs_tsv_names(names) if fmt == "pairs_tsv" else names
    except (OSError, ValueError, pa.ArrowException):
        return None  # unreadable, empty, malformed: the reader reports it in its own words


def check_corpus_columns(section: DataSection, *, pairs: bool) -> None:
    """Fail fast, before Ray starts, when the corpus lacks a column the job reads.

    ``pairs``: the job reads (anchor, positive[, negative]) rows (:func:`pair_columns`),
    else sentences (:func:`corpus_columns`). Looks only at the first file's header, schema
    or leading records, and raises the very error the Ray Data reader raises later for the
    same file, so a bad column name costs seconds, not a Ray start. A ``pairs_tsv`` file
    must have 2 or 3 fields on its first line. With ``pairs`` the candidate pool
    (``data.pool``) is checked the same way, its path first. Text files have no columns;
    whatever this cannot tell surely is left to the reader.

    Raises:
        DataError: naming the config key of the missing column and the columns there are,
            ``data.pool`` when the pool does not exist, or ``data.format`` when the format
            cannot be told from the path or is a pair format for sentences.
    """
    if section.path is None:
        return
    fmt = infer_format(section.path, section.format)
    if not pairs:
        require_sentence_format(fmt)
        if section.pool is not None:
            raise DataError(
                "data.pool: a candidate pool is for pair inputs (task: pairs, "
                "jobs/mine.py); unsupervised SimCSE mines among its own sentences"
            )
    elif section.pool is not None:
        check_corpus_path(section.pool, key="data.pool")
        pool_fmt = infer_format(section.pool, section.pool_format, key="data.pool_format")
        _check_columns(section.pool, pool_fmt, corpus_columns(section), "data.pool")
    wanted = pair_columns(section) if pairs else corpus_columns(section)
    _check_columns(section.path, fmt, wanted, "data.path")


def _check_columns(path: str, fmt: str, wanted: dict[str, str], key: str) -> None:
    """:func:`check_corpus_columns` for one input: the columns ``wanted`` (config key ->
    column), or a ``pairs_tsv`` file's field count (its error naming ``key``)."""
    if fmt == "text":
        return
    names = _header_columns(path, fmt, list(wanted.values()))
    if names is None:
        return
    if fmt == "pairs_tsv":
        require_pairs_tsv_fields(names, path, key)
    else:
        require_column_names(names, path, wanted)
