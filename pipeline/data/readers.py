"""Reading corpus files with Ray Data: format inference, column checks before any compute,
and read errors turned into one line naming the file.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from pipeline.config.sections import DataSection
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


class DataError(ValueError):
    """The corpus cannot be used; the message says why and names the config key."""


def infer_format(path: str, configured: str) -> str:
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
        f"data.format: cannot tell the format of {path!r} from its extension; "
        "set data.format to text, csv, tsv, jsonl or parquet"
    )


def _filesystem(path: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem and its inner path for a local path or any URI pyarrow knows."""
    try:
        return pafs.FileSystem.from_uri(path)
    except (pa.ArrowInvalid, ValueError):
        return pafs.LocalFileSystem(), os.path.abspath(path)


def check_corpus_path(path: str) -> None:
    """Fail fast, before Ray starts, when the corpus path does not exist."""
    filesystem, inner = _filesystem(path)
    try:
        info = filesystem.get_file_info(inner)
    except OSError as exc:
        raise DataError(f"data.path: cannot access {path}: {str(exc).splitlines()[0]}") from None
    if info.type == pafs.FileType.NotFound:
        raise DataError(f"data.path: {path} does not exist")


def corpus_columns(section: DataSection) -> dict[str, str]:
    """Config key -> column the unsupervised corpus reader needs (:func:`read_corpus`)."""
    return {"data.text_column": section.text_column}


def pair_columns(section: DataSection) -> dict[str, str]:
    """Config key -> column the pair reader needs (:func:`read_pairs`): anchor, positive, and
    the negative when ``data.negative_column`` is set."""
    columns = {
        "data.anchor_column": section.anchor_column,
        "data.positive_column": section.positive_column,
    }
    if section.negative_column:
        columns["data.negative_column"] = section.negative_column
    return columns


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


def _header_columns(section: DataSection, wanted: Sequence[str]) -> list[str] | None:
    """The column names a Ray Data read of the corpus starts with, from the first file's
    header (csv/tsv, parsed as :func:`read_dataset` parses it), schema (parquet) or records
    (jsonl); None when that cannot be told cheaply and surely."""
    import pyarrow.parquet as pq

    assert section.path is not None
    fmt = infer_format(section.path, section.format)
    filesystem, inner = _filesystem(section.path)
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

            return list(pacsv.open_csv(stream, parse_options=_csv_parse_options(fmt)).schema.names)
    except (OSError, ValueError, pa.ArrowException):
        return None  # unreadable, empty, malformed: the reader reports it in its own words


def check_corpus_columns(section: DataSection, *, pairs: bool) -> None:
    """Fail fast, before Ray starts, when the corpus lacks a column the job reads.

    ``pairs``: the job reads (anchor, positive[, negative]) rows (:func:`pair_columns`),
    else sentences (:func:`corpus_columns`). Looks only at the first file's header, schema
    or leading records, and raises the very error the Ray Data reader raises later for the
    same file, so a bad column name costs seconds, not a Ray start. Text files have no
    columns; whatever this cannot tell surely is left to the reader.

    Raises:
        DataError: naming the config key of the missing column and the columns there are,
            or ``data.format`` when the format cannot be told from the path.
    """
    if section.path is None:
        return
    if infer_format(section.path, section.format) == "text":
        return
    wanted = pair_columns(section) if pairs else corpus_columns(section)
    names = _header_columns(section, list(wanted.values()))
    if names is not None:
        require_column_names(names, section.path, wanted)


def _csv_parse_options(fmt: str) -> Any:
    """How csv/tsv files are split into cells: one place for the reader and the header check,
    so both see the same columns."""
    import pyarrow.csv as pacsv

    return pacsv.ParseOptions(delimiter="\t" if fmt == "tsv" else ",")


def read_dataset(path: str, fmt: str, text_columns: Sequence[str] = ()) -> Any:
    """A Ray Dataset over a file, folder or URI in one of the supported formats.

    Text files give two columns, ``text`` and :data:`INVALID_UTF8`; the others keep their
    own columns. ``text_columns`` of a csv/tsv file are read as bytes, whatever they look
    like: CSV has no types (a column of numbers is still sentences), and bytes let a cell
    that is not UTF-8 be dropped and counted rather than fail the read.
    """
    import ray.data

    if fmt == "text":
        return ray.data.read_datasource(_utf8_lines_datasource()(path))
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
    # Imported here: pipeline.errors imports this module (for DataError).
    from pipeline.errors import first_line, root_cause

    exc = root_cause(exc, follow_context=True)
    if isinstance(exc, UnicodeDecodeError):
        # Ray Data appends its retry advice to the codec name, so str(exc) is garbled.
        return f"not valid UTF-8 ({exc.reason} at byte {exc.start})"
    return first_line(exc)


class _HideErrors(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.ERROR


@contextmanager
def reading(path: str, fmt: str) -> Iterator[None]:
    """Turn a failed read (malformed CSV or JSON, JSON that is not UTF-8, an unreadable
    file) into one :class:`DataError` naming ``data.path``.

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
        raise DataError(f"data.path: cannot read {path} as {fmt}: {_root_message(exc)}") from exc
    finally:
        for handler in console:
            handler.removeFilter(hide)
