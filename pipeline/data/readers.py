"""Reading corpus files with Ray Data: format inference, column checks before any compute,
and read errors turned into one line naming the file.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from pipeline.config.data_section import DataSection
from pipeline.core.errors import DataError, first_line, root_cause
from pipeline.data.utf8 import _utf8_lines_datasource

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


PAIRS_TSV_COLUMNS = ("sentence1", "sentence2", "label")
"""The fields of a ``pairs_tsv`` line, as :func:`read_dataset` names them (a 2-field file has
the first two)."""


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


def _filesystem(path: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem and its inner path for a local path or any URI pyarrow knows."""
    try:
        return pafs.FileSystem.from_uri(path)
    except (pa.ArrowInvalid, ValueError):
        return pafs.LocalFileSystem(), os.path.abspath(path)


def check_corpus_path(path: str, key: str = "data.path") -> None:
    """Fail fast, before Ray starts, when the corpus path (or the one ``key`` names) does not
    exist."""
    filesystem, inner = _filesystem(path)
    try:
        info = filesystem.get_file_info(inner)
    except OSError as exc:
        raise DataError(f"{key}: cannot access {path}: {str(exc).splitlines()[0]}") from None
    if info.type == pafs.FileType.NotFound:
        raise DataError(f"{key}: {path} does not exist")


def corpus_columns(section: DataSection) -> dict[str, str]:
    """Config key -> column the unsupervised corpus reader needs (:func:`read_corpus`)."""
    return {"data.text_column": section.text_column}


def pair_columns(section: DataSection) -> dict[str, str]:
    """Config key -> column the pair reader needs (:func:`read_pairs`): anchor, positive, the
    label when ``data.label_column`` is set, and the negative when ``data.negative_column`` is
    set and ``data.given_negatives`` is on. ``pairs_tsv`` files have fields, not columns:
    none."""
    if section.format == "pairs_tsv":
        return {}
    columns = {
        "data.anchor_column": section.anchor_column,
        "data.positive_column": section.positive_column,
    }
    if section.label_column:
        columns["data.label_column"] = section.label_column
    if section.negative_column and section.given_negatives:
        columns["data.negative_column"] = section.negative_column
    return columns


def pool_columns(section: DataSection) -> dict[str, str]:
    """Config key -> column the candidate-pool reader needs: ``data.pool_text_column`` of a
    csv/tsv/jsonl/parquet ``data.pool``."""
    return {"data.pool_text_column": section.pool_text_column}


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
    import pyarrow.json as pajson

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
    header (csv/tsv, parsed as :func:`read_dataset` parses it; ``pairs_tsv``: the fields of
    its first line, named as :func:`read_dataset` names them), schema (parquet) or records
    (jsonl); None when that cannot be told cheaply and surely."""
    import pyarrow.parquet as pq

    filesystem, inner = _filesystem(path)
    try:
        file = _first_file(filesystem, inner, fmt)
        if file is None:
            return None
        if fmt == "parquet":
            return list(pq.read_schema(file, filesystem=filesystem).names)
        with filesystem.open_input_stream(file) as stream:  # decompresses by extension
            if fmt == "jsonl":
                return _jsonl_columns(stream, wanted)
            import pyarrow.csv as pacsv

            reader = pacsv.open_csv(
                stream, read_options=_csv_read_options(fmt), parse_options=_csv_parse_options(fmt)
            )
            names = list(reader.schema.names)
            return _pairs_tsv_names(names) if fmt == "pairs_tsv" else names
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
                "data.pool: a candidate pool is for pair inputs (mining.negative_mode=triplet, "
                "jobs/mine.py); unsupervised SimCSE mines among its own sentences"
            )
    elif section.pool is not None:
        check_corpus_path(section.pool, key="data.pool")
        pool_fmt = infer_format(section.pool, section.pool_format, key="data.pool_format")
        _check_columns(section.pool, pool_fmt, pool_columns(section), "data.pool")
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


def require_sentence_format(fmt: str) -> None:
    """The unsupervised corpus is sentences: a pair format is a config mistake."""
    if fmt == "pairs_tsv":
        raise DataError(
            "data.format: pairs_tsv holds (sentence1, sentence2[, label]) pairs, which only "
            "mining.negative_mode=triplet (or jobs/mine.py) reads; sentences are text, csv, "
            "tsv, jsonl or parquet"
        )


def _pairs_tsv_names(fields: Sequence[str]) -> list[str]:
    """Pyarrow's generated names (``f0``, ``f1``, ...) of a headerless file as
    :data:`PAIRS_TSV_COLUMNS`; fields past the third keep their generated names."""
    return [PAIRS_TSV_COLUMNS[i] if i < len(PAIRS_TSV_COLUMNS) else name for i, name in enumerate(fields)]


def require_pairs_tsv_fields(names: Sequence[str], path: str, key: str) -> None:
    """A ``pairs_tsv`` file has 2 or 3 tab-separated fields per line."""
    if len(names) not in (2, 3):
        raise DataError(
            f"{key}: {path} has {len(names)} tab-separated field{'s' if len(names) != 1 else ''} "
            "on its first line; pairs_tsv reads 2 (sentence1, sentence2) or 3 (sentence1, "
            "sentence2, label), unquoted"
        )


def _csv_parse_options(fmt: str) -> Any:
    """How csv/tsv files are split into cells: one place for the reader and the header check,
    so both see the same columns."""
    import pyarrow.csv as pacsv

    if fmt == "pairs_tsv":  # quoting off: a field runs to the next tab, quotes included
        return pacsv.ParseOptions(delimiter="\t", quote_char=False, invalid_row_handler=_fail_row)
    return pacsv.ParseOptions(delimiter="\t" if fmt == "tsv" else ",", invalid_row_handler=_fail_row)


def _fail_row(row: Any) -> str:
    """A row with the wrong number of fields fails the read, as pyarrow does by default. Said
    explicitly because options without a handler come back from a pickle (Ray Data ships them
    to its read tasks) with a None one that pyarrow 25 calls, printing a TypeError first."""
    return "error"


_RAY_CSV_FAILURE = re.compile(r"Failed to read CSV file: (.+?)\. Please check the CSV file")


def _csv_parse_error(message: str, fmt: str) -> str | None:
    """Pyarrow's own words for the first bad row (``CSV parse error: Row #3: Expected 3
    columns, got 2: ...``) of the file a Ray Data csv read failed on.

    Ray Data's read task reports only that the file failed (its cause does not survive the
    trip back from the task), so the file named in ``message`` is parsed again here, as the
    task parsed it, on this error path only. None when the message names no file or the
    file parses here.
    """
    import pyarrow.csv as pacsv

    match = _RAY_CSV_FAILURE.search(message)
    if fmt not in ("csv", "tsv", "pairs_tsv") or match is None:
        return None
    filesystem, inner = _filesystem(match.group(1))
    try:
        with filesystem.open_input_stream(inner) as stream:
            reader = pacsv.open_csv(
                stream, read_options=_csv_read_options(fmt), parse_options=_csv_parse_options(fmt)
            )
            for _ in reader:
                pass
    except (OSError, ValueError, pa.ArrowException) as exc:
        return str(exc).splitlines()[0] if str(exc) else None
    return None


def _csv_read_options(fmt: str) -> Any:
    """Header or not: ``pairs_tsv`` files have none, so pyarrow names the fields ``f0``,
    ``f1``, ... (single-threaded, as Ray Data reads, so errors name the row)."""
    import pyarrow.csv as pacsv

    return pacsv.ReadOptions(use_threads=False, autogenerate_column_names=fmt == "pairs_tsv")


def read_dataset(path: str, fmt: str, text_columns: Sequence[str] = ()) -> Any:
    """A Ray Dataset over a file, folder or URI in one of the supported formats.

    Text files give two columns, ``text`` and :data:`INVALID_UTF8`; ``pairs_tsv`` files
    :data:`PAIRS_TSV_COLUMNS` (the sentences as bytes, the label as a string); the others keep
    their own columns. ``text_columns`` of a csv/tsv file are read as bytes, whatever they
    look like: CSV has no types (a column of numbers is still sentences), and bytes let a cell
    that is not UTF-8 be dropped and counted rather than fail the read.
    """
    import ray.data

    if fmt == "text":
        return ray.data.read_datasource(_utf8_lines_datasource()(path))
    if fmt == "pairs_tsv":
        import pyarrow.csv as pacsv

        ds = ray.data.read_csv(
            path,
            read_options=_csv_read_options(fmt),
            parse_options=_csv_parse_options(fmt),
            convert_options=pacsv.ConvertOptions(
                column_types={"f0": pa.binary(), "f1": pa.binary(), "f2": pa.string()}
            ),
        )
        names = ds.schema().names
        return ds.rename_columns(dict(zip(names, _pairs_tsv_names(names), strict=True)))
    if fmt in ("csv", "tsv"):
        import pyarrow.csv as pacsv

        return ray.data.read_csv(
            path,
            parse_options=_csv_parse_options(fmt),
            convert_options=pacsv.ConvertOptions(column_types={c: pa.binary() for c in text_columns}),
        )
    if fmt == "jsonl":
        return ray.data.read_json(path, lines=True)
    return ray.data.read_parquet(path)


def require_column_names(names: Sequence[str], path: str, wanted: dict[str, str]) -> None:
    """Fail with the config key when a column is missing; ``wanted`` maps key -> column.

    The one place this message is made: the check before Ray (:func:`check_corpus_columns`)
    and the Ray Data readers report a missing column in the same words.
    """
    for key, column in wanted.items():
        if column not in names:
            raise DataError(f"{key}: column {column!r} not in {path} (columns: {', '.join(names)})")


def require_columns(ds: Any, path: str, wanted: dict[str, str]) -> None:
    """:func:`require_column_names` for a Ray Dataset's schema."""
    require_column_names(ds.schema().names, path, wanted)


def _is_text_type(dtype: pa.DataType) -> bool:
    """Types a sentence column may have: strings, bytes (decoded as UTF-8), all-null."""
    if pa.types.is_dictionary(dtype):
        return _is_text_type(dtype.value_type)
    return (
        pa.types.is_string(dtype)
        or pa.types.is_large_string(dtype)
        or pa.types.is_binary(dtype)
        or pa.types.is_large_binary(dtype)
        or pa.types.is_null(dtype)
        or getattr(pa.types, "is_string_view", lambda _: False)(dtype)
    )


def require_text_column(ds: Any, path: str, key: str, column: str) -> None:
    """Fail with the config key when a sentence column holds something other than text.

    Casting numbers to strings would train on ``"17"``, ``"42"``: a wrong column choice,
    not a corpus.
    """
    schema = ds.schema()
    dtype = dict(zip(schema.names, schema.types, strict=True)).get(column)
    if isinstance(dtype, pa.DataType) and not _is_text_type(dtype):
        raise DataError(f"{key}: column {column!r} in {path} holds {dtype}, not text (strings)")


def read_corpus(section: DataSection) -> Any:
    """A Ray Dataset with a string column ``text`` (unclean), and for text files also
    :data:`INVALID_UTF8`."""
    assert section.path is not None
    fmt = infer_format(section.path, section.format)
    require_sentence_format(fmt)
    ds = read_dataset(section.path, fmt, text_columns=[section.text_column])
    if fmt == "text":
        return ds
    columns = corpus_columns(section)
    require_columns(ds, section.path, columns)
    for key, column in columns.items():
        require_text_column(ds, section.path, key, column)
    ds = ds.select_columns([section.text_column])
    return ds.rename_columns({section.text_column: "text"}) if section.text_column != "text" else ds


def _root_message(exc: BaseException) -> str:
    """The first line of the innermost cause: what went wrong in the reader, not Ray's wrapper."""
    exc = root_cause(exc, follow_context=True)
    if isinstance(exc, UnicodeDecodeError):
        # Ray Data appends its retry advice to the codec name, so str(exc) is garbled.
        return f"not valid UTF-8 ({exc.reason} at byte {exc.start})"
    return first_line(exc)


class _HideErrors(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.ERROR


@contextmanager
def reading(path: str, fmt: str, key: str = "data.path") -> Iterator[None]:
    """Turn a failed read (malformed CSV or JSON, JSON that is not UTF-8, an unreadable
    file, a ``pairs_tsv`` row with the wrong number of fields) into one :class:`DataError`
    naming ``key`` (``data.path``).

    Ray Data also logs such a failure with its traceback on the console; that copy is held
    back here (it still goes to Ray Data's log file) because the job reports the failure as
    one line, and ``--debug`` shows the traceback, chained to the DataError.
    """
    console = [
        h
        for h in logging.getLogger("ray.data").handlers
        if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)
    ]
    hide = _HideErrors()
    for handler in console:
        handler.addFilter(hide)
    try:
        yield
    except DataError:
        raise
    except Exception as exc:
        message = _root_message(exc)
        message = _csv_parse_error(message, fmt) or message
        raise DataError(f"{key}: cannot read {path} as {fmt}: {message}") from exc
    finally:
        for handler in console:
            handler.removeFilter(hide)
