"""Corpus stage: Ray Data readers, cleaning, exact dedup, stable ids, tokenization.

Flow: read (txt/csv/tsv/jsonl/parquet, local or any pyarrow filesystem URI) -> clean
(strip, content-hash id) -> drop empty and duplicate rows -> tokenize in ``map_batches``
-> one Arrow table ``(id, text, input_ids)`` sorted by id, put in the object store once and
shared by the train workers and the miner. Training addresses rows by position in that
table, which is why the corpus is materialised rather than streamed into the train loop.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from pipeline.config import DataSection

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


INVALID_UTF8 = "invalid_utf8"
"""Bool column the readers add: the row's text was not valid UTF-8 (its ``text`` is empty)."""


class DataError(ValueError):
    """The corpus cannot be used; the message says why and names the config key."""


@dataclass
class CorpusStats:
    rows_read: int
    empty_dropped: int
    duplicates_dropped: int
    sentences: int
    beyond_max_rows: int = 0
    invalid_utf8_dropped: int = 0
    """Lines (text) or cells (csv/tsv, binary parquet columns) that are not valid UTF-8."""

    def describe(self) -> str:
        limited = f" (data.max_rows left out {self.beyond_max_rows})" if self.beyond_max_rows else ""
        invalid = f", {self.invalid_utf8_dropped} not valid UTF-8" if self.invalid_utf8_dropped else ""
        return (
            f"read {self.rows_read} rows; dropped {self.empty_dropped} empty{invalid} and "
            f"{self.duplicates_dropped} exact duplicates; {self.sentences} sentences remain{limited}"
        )

    def tags(self) -> dict[str, int]:
        """The counts as MLflow run tags."""
        return {
            "data.rows_read": self.rows_read,
            "data.empty_dropped": self.empty_dropped,
            "data.invalid_utf8_dropped": self.invalid_utf8_dropped,
            "data.duplicates_dropped": self.duplicates_dropped,
            "data.sentences": self.sentences,
        }


@dataclass
class TokenizeStats:
    sentences: int
    truncated: int
    """Sentences longer than ``max_seq_len`` tokens (special tokens included), cut to it."""
    max_seq_len: int

    HINT_SHARE = 0.05
    """From this share of truncated sentences on, :meth:`describe` suggests a longer
    ``data.max_seq_len``."""

    def describe(self) -> str:
        return (
            f"{self.sentences} sentences (max_seq_len {self.max_seq_len}; {self.truncated} truncated"
            f"{self.truncation_hint()})"
        )

    def truncation_hint(self) -> str:
        """``": 25.6% of sentences are longer, consider raising data.max_seq_len"`` when at least
        :attr:`HINT_SHARE` of the sentences were cut, else ``""``. Only the share is known:
        the tokenized lengths stop at ``max_seq_len``, so how long the cut sentences were is not."""
        share = self.truncated / self.sentences if self.sentences else 0.0
        if share < self.HINT_SHARE:
            return ""
        return f": {share:.1%} of sentences are longer, consider raising data.max_seq_len"

    def tags(self) -> dict[str, int]:
        return {"data.truncated": self.truncated}


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


def stable_row_id(text: str) -> int:
    """63-bit content hash: the same sentence gets the same id in every run and on every node."""
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF_FFFF_FFFF


def split_utf8_lines(data: bytes) -> tuple[list[str], list[bool] | None]:
    """The lines of a file's bytes, as ``read_text`` splits them, and which were not UTF-8.

    Returns ``(lines, invalid)``; ``invalid`` is None when every line decoded. An undecodable
    line becomes ``""`` flagged True. UTF-8 never uses a newline byte inside a multi-byte
    character, so decoding line by line finds exactly the bad lines.
    """
    try:
        return data.decode("utf-8").splitlines(), None
    except UnicodeDecodeError:
        pass
    lines: list[str] = []
    invalid: list[bool] = []
    for raw in data.splitlines():
        try:
            # str.splitlines also splits on \v, \f, U+2028, ...: as the whole-file path does.
            parts = raw.decode("utf-8").splitlines() or [""]
        except UnicodeDecodeError:
            parts = None
        if parts is None:
            lines.append("")
            invalid.append(True)
        else:
            lines.extend(parts)
            invalid.extend([False] * len(parts))
    return lines, invalid


@functools.cache
def _utf8_lines_datasource() -> type:
    """A ``read_text`` datasource that skips undecodable lines instead of failing the file.

    Ray's own reader decodes a whole file at once, so one bad byte in a 10M-line crawl
    fails the job. Built on first use so that importing this module does not import Ray Data.
    """
    from ray.data.datasource import FileBasedDatasource

    class Utf8LinesDatasource(FileBasedDatasource):
        def _read_stream(self, f: Any, path: str) -> Iterator[pa.Table]:
            lines, invalid = split_utf8_lines(f.readall())
            flags = pa.array(invalid if invalid is not None else np.zeros(len(lines), dtype=bool), pa.bool_())
            yield pa.table({"text": pa.array(lines, pa.string()), INVALID_UTF8: flags})

    return Utf8LinesDatasource


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


def decode_utf8(column: Any) -> tuple[pa.Array, pa.Array]:
    """A binary column as strings, and a bool column marking values that are not UTF-8
    (they become null). One vectorised cast when the whole column is valid."""
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    try:
        return pc.cast(column, pa.string()), pa.array(np.zeros(len(column), dtype=bool))
    except pa.ArrowInvalid:
        pass
    texts: list[str | None] = []
    invalid: list[bool] = []
    for value in column.to_pylist():
        try:
            texts.append(None if value is None else value.decode("utf-8"))
            invalid.append(False)
        except UnicodeDecodeError:
            texts.append(None)
            invalid.append(True)
    return pa.array(texts, pa.string()), pa.array(invalid, pa.bool_())


def _as_text(column: Any) -> tuple[Any, Any]:
    """``(strings, not-UTF-8 flags or None)`` for a sentence column of any accepted type."""
    if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
        return decode_utf8(column)
    if not pa.types.is_string(column.type) and not pa.types.is_large_string(column.type):
        column = pc.cast(column, pa.string())
    return column, None


def _clean_batch(batch: pa.Table) -> pa.Table:
    text, bad = _as_text(batch.column("text"))
    if INVALID_UTF8 in batch.column_names:
        read_bad = batch.column(INVALID_UTF8)
        bad = read_bad if bad is None else pc.or_(read_bad, bad)
    if bad is None:
        bad = pa.array(np.zeros(batch.num_rows, dtype=bool))
    text = pc.fill_null(pc.utf8_trim_whitespace(text), "")
    ids = pa.array([stable_row_id(t) if t else 0 for t in text.to_pylist()], type=pa.int64())
    return pa.table({"id": ids, "text": text, INVALID_UTF8: bad})


def _root_message(exc: BaseException) -> str:
    """The first line of the innermost cause: what went wrong in the reader, not Ray's wrapper."""
    seen = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        inner = getattr(exc, "cause", None) or exc.__cause__
        if inner is None and not exc.__suppress_context__:
            inner = exc.__context__
        if not isinstance(inner, BaseException) or inner is exc:
            break
        exc = inner
    if isinstance(exc, UnicodeDecodeError):
        # Ray Data appends its retry advice to the codec name, so str(exc) is garbled.
        return f"not valid UTF-8 ({exc.reason} at byte {exc.start})"
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


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


def load_clean_corpus(section: DataSection) -> tuple[pa.Table, CorpusStats]:
    """Read and clean the corpus with Ray Data; return ``(id, text)`` sorted by id, unique.

    Lines (or cells) that are not valid UTF-8 are dropped and counted, not fatal: one bad
    line in a 10M-line crawl should not stop the job.

    Raises:
        DataError: the corpus cannot be read, or nothing usable is left after cleaning.
    """
    import ray

    assert section.path is not None
    with reading(section.path, infer_format(section.path, section.format)):
        ds = read_corpus(section).map_batches(
            _clean_batch, batch_format="pyarrow", num_cpus=section.tokenize_num_cpus
        )
        tables = [t for t in ray.get(ds.to_arrow_refs()) if t.num_rows]
    raw = (
        pa.concat_tables(tables)
        if tables
        else pa.table(
            {
                "id": pa.array([], pa.int64()),
                "text": pa.array([], pa.string()),
                INVALID_UTF8: pa.array([], pa.bool_()),
            }
        )
    )
    rows_read = raw.num_rows
    decoded = raw.filter(pc.invert(raw.column(INVALID_UTF8)))
    non_empty = decoded.filter(pc.not_equal(pc.utf8_length(decoded.column("text")), 0))
    ids = non_empty.column("id").to_numpy()
    unique_ids, first = np.unique(ids, return_index=True)
    if section.max_rows is not None:
        # Sorted by content hash, the first rows are a fixed pseudo-random sample.
        first = first[: section.max_rows]
    corpus = non_empty.take(pa.array(first)).select(["id", "text"])  # np.unique sorts: sorted by id
    stats = CorpusStats(
        rows_read=rows_read,
        empty_dropped=decoded.num_rows - non_empty.num_rows,
        duplicates_dropped=non_empty.num_rows - len(unique_ids),
        sentences=corpus.num_rows,
        beyond_max_rows=len(unique_ids) - corpus.num_rows,
        invalid_utf8_dropped=rows_read - decoded.num_rows,
    )
    if corpus.num_rows == 0:
        raise DataError(f"data.path: {section.path} has no non-empty sentences ({stats.describe()})")
    return corpus.combine_chunks(), stats


def _encode(tokenizer: Any, texts: list[str], max_length: int) -> list[list[int]]:
    return tokenizer(
        texts,
        truncation=True,
        max_length=max_length,
        padding=False,
        return_attention_mask=False,
        return_token_type_ids=False,
    )["input_ids"]


def tokenize_table(
    batch: pa.Table, tokenizer: Any, max_seq_len: int, *, flag_truncated: bool = False
) -> pa.Table:
    """Append ``input_ids`` (list<int32>, special tokens included, truncated) to a ``text`` table.

    With ``flag_truncated`` also a bool column ``truncated``: the sentence had more than
    ``max_seq_len`` tokens. Encoding to ``max_seq_len + 1`` tells exactly that (a row reaches
    it only if longer than ``max_seq_len``) for any tokenizer and special-token template;
    only those rows are encoded again at ``max_seq_len``.
    """
    texts = batch.column("text").to_pylist()
    if not flag_truncated:
        encoded = _encode(tokenizer, texts, max_seq_len)
        return batch.append_column("input_ids", pa.array(encoded, type=pa.list_(pa.int32())))
    encoded = _encode(tokenizer, texts, max_seq_len + 1)
    truncated = [len(ids) > max_seq_len for ids in encoded]
    long_rows = [i for i, cut in enumerate(truncated) if cut]
    if long_rows:
        again = _encode(tokenizer, [texts[i] for i in long_rows], max_seq_len)
        for i, ids in zip(long_rows, again, strict=True):
            encoded[i] = ids
    table = batch.append_column("input_ids", pa.array(encoded, type=pa.list_(pa.int32())))
    return table.append_column("truncated", pa.array(truncated, pa.bool_()))


def _clean_text(column: Any) -> Any:
    """Stripped strings; a cell that is not UTF-8 becomes empty, so its row is dropped."""
    text, _ = _as_text(column)
    return pc.utf8_trim_whitespace(pc.fill_null(text, ""))


def read_pairs(section: DataSection) -> tuple[list[str], list[str], list[str] | None, int]:
    """``(anchors, positives, negatives, rows read)``, stripped, rows with an empty anchor or
    positive dropped.

    A text file gives each sentence as its own positive. Pair files use
    ``data.anchor_column`` / ``data.positive_column``, and ``data.negative_column`` when set
    (an empty cell: no given negative for that row; ``negatives`` is None when unset).
    """
    import ray

    assert section.path is not None
    fmt = infer_format(section.path, section.format)
    columns = pair_columns(section)
    negatives = None
    with reading(section.path, fmt):
        ds = read_dataset(section.path, fmt, text_columns=list(columns.values()))
        if fmt == "text":
            tables = [t for t in ray.get(ds.to_arrow_refs()) if t.num_rows]
            text = pa.concat_tables(tables).column("text") if tables else pa.array([], pa.string())
            anchors = positives = _clean_text(text)  # lines that are not UTF-8 are empty here
        else:
            require_columns(ds, section.path, columns)
            for key, column in columns.items():
                require_text_column(ds, section.path, key, column)
            wanted = list(dict.fromkeys(columns.values()))
            table = pa.concat_tables(ray.get(ds.select_columns(wanted).to_arrow_refs()))
            anchors = _clean_text(table.column(section.anchor_column))
            positives = _clean_text(table.column(section.positive_column))
            if section.negative_column:
                negatives = _clean_text(table.column(section.negative_column))
    keep = pc.and_(pc.greater(pc.utf8_length(anchors), 0), pc.greater(pc.utf8_length(positives), 0))
    rows = len(anchors)
    anchors_list = pc.filter(anchors, keep).to_pylist()
    if not anchors_list:
        raise DataError(f"data.path: {section.path} has no non-empty (anchor, positive) pairs")
    positives_list = pc.filter(positives, keep).to_pylist()
    negatives_list = pc.filter(negatives, keep).to_pylist() if negatives is not None else None
    if section.max_rows is not None:  # the first rows: pair files keep their own order
        anchors_list, positives_list = anchors_list[: section.max_rows], positives_list[: section.max_rows]
        negatives_list = negatives_list[: section.max_rows] if negatives_list is not None else None
    return anchors_list, positives_list, negatives_list, rows


@dataclass
class Triplets:
    """Supervised rows as positions into one de-duplicated text corpus."""

    anchor: np.ndarray
    positive: np.ndarray
    negative: np.ndarray
    """Given negative per row, -1 where none."""

    def __len__(self) -> int:
        return len(self.anchor)


def index_triplets(
    anchors: list[str], positives: list[str], negatives: list[str] | None
) -> tuple[pa.Table, Triplets]:
    """One ``(id, text)`` table of every distinct text, sorted by id, and the rows as positions
    in it: each text is tokenized and encoded once however often it occurs."""
    texts = set(anchors) | set(positives) | ({t for t in negatives if t} if negatives else set())
    ids = np.array([stable_row_id(t) for t in texts], dtype=np.int64)
    text_list = list(texts)
    order = np.argsort(ids)
    table = pa.table({"id": ids[order], "text": [text_list[i] for i in order]})
    position = {text_list[i]: rank for rank, i in enumerate(order.tolist())}
    negative = (
        np.array([position[t] if t else -1 for t in negatives], dtype=np.int64)
        if negatives is not None
        else np.full(len(anchors), -1, dtype=np.int64)
    )
    triplets = Triplets(
        np.array([position[t] for t in anchors], dtype=np.int64),
        np.array([position[t] for t in positives], dtype=np.int64),
        negative,
    )
    return table, triplets


class _TokenizeBatches:
    """Ray Data actor: loads the tokenizer once, then tokenizes batch after batch.

    Plain tasks would each start a worker that imports transformers and unpickles the
    tokenizer, which costs far more than the tokenization of a batch.
    """

    def __init__(self, tokenizer: Any, max_seq_len: int):
        self.tokenizer = tokenizer
        self.max_seq_len = max_seq_len

    def __call__(self, batch: pa.Table) -> pa.Table:
        return tokenize_table(batch, self.tokenizer, self.max_seq_len, flag_truncated=True)


def tokenize_corpus(corpus: pa.Table, tokenizer: Any, section: DataSection) -> pa.Table:
    """Tokenize ``(id, text)`` with Ray Data ``map_batches`` over a pool of tokenizer actors;
    returns ``(id, text, input_ids)`` in the input's row order (sorted by id)."""
    return tokenize_corpus_with_stats(corpus, tokenizer, section)[0]


def tokenize_corpus_with_stats(
    corpus: pa.Table, tokenizer: Any, section: DataSection
) -> tuple[pa.Table, TokenizeStats]:
    """:func:`tokenize_corpus`, and how many sentences were cut to ``data.max_seq_len``."""
    import warnings

    import ray
    import ray.data

    rows_per_block = max(section.tokenize_batch_size, 1)
    blocks = [corpus.slice(start, rows_per_block) for start in range(0, corpus.num_rows, rows_per_block)]
    with warnings.catch_warnings():
        # Ray (2.60) takes max_restarts only through map_batches' **ray_remote_args, which it
        # marks deprecated (removal planned for 2.64) without a named replacement yet.
        warnings.filterwarnings(
            "ignore", message="`ray_remote_args` is deprecated", category=DeprecationWarning
        )
        ds = ray.data.from_arrow_refs([ray.put(block) for block in blocks]).map_batches(
            _TokenizeBatches,
            batch_format="pyarrow",
            batch_size=section.tokenize_batch_size,
            num_cpus=section.tokenize_num_cpus,
            compute=ray.data.ActorPoolStrategy(min_size=1, max_size=section.tokenize_actors),
            fn_constructor_kwargs={"tokenizer": tokenizer, "max_seq_len": section.max_seq_len},
            # Ray Data restarts pool actors without limit by default. Tokenizing is a short
            # stage at job start, before any training, so a dead tokenizer actor fails the job
            # at once with its error instead. A restart would also depend on the tokenizer
            # argument still being in the object store (what Ray warns about for
            # max_restarts > 0).
            max_restarts=0,
        )
    tokenized = pa.concat_tables(ray.get(ds.to_arrow_refs()))
    stats = TokenizeStats(
        sentences=tokenized.num_rows,
        truncated=int(pc.sum(tokenized.column("truncated")).as_py() or 0),
        max_seq_len=section.max_seq_len,
    )
    # Blocks may finish out of order; ids are unique, so sorting restores the input order.
    return tokenized.drop_columns(["truncated"]).sort_by("id").combine_chunks(), stats


class TokenizedCorpus:
    """Position-addressed view of the tokenized table, shared by training and mining.

    Holds numpy views of the Arrow buffers (no copy when the table came from the object
    store) and pads any set of rows into a batch.
    """

    def __init__(self, table: pa.Table, pad_token_id: int):
        tokens = table.column("input_ids").combine_chunks()
        self.ids = table.column("id").to_numpy() if "id" in table.column_names else np.arange(table.num_rows)
        self.offsets = tokens.offsets.to_numpy()
        self.values = tokens.values.to_numpy()
        self.lengths = np.diff(self.offsets)
        self.pad_token_id = pad_token_id

    def __len__(self) -> int:
        return len(self.ids)

    def batch(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(input_ids, attention_mask)`` of shape ``(len(rows), longest)``, right-padded."""
        lengths = self.lengths[rows]
        width = int(lengths.max())
        input_ids = np.full((len(rows), width), self.pad_token_id, dtype=np.int64)
        mask = np.arange(width)[None, :] < lengths[:, None]
        starts = self.offsets[rows]
        input_ids[mask] = self.values[(starts[:, None] + np.arange(width)[None, :])[mask]]
        return input_ids, mask.astype(np.int64)


def row_lengths(corpus: TokenizedCorpus, triplets: Triplets | None = None) -> np.ndarray:
    """Tokens per training row, i.e. the width a row forces on its padded batch: a sentence's
    length, or for a triplet row the longer of its anchor and positive."""
    if triplets is None:
        return corpus.lengths
    return np.maximum(corpus.lengths[triplets.anchor], corpus.lengths[triplets.positive])


def dataset_digest(corpus: pa.Table, triplets: Triplets | None = None) -> str:
    """A content fingerprint of the cleaned training data: the same sentences (and, for
    triplets, the same rows) give the same digest whatever the file's name or row order."""
    import hashlib

    digest = hashlib.blake2b(digest_size=8)
    digest.update(np.sort(corpus.column("id").to_numpy()).astype("<i8").tobytes())
    if triplets is not None:
        ids = corpus.column("id").to_numpy()
        rows = np.stack([ids[triplets.anchor], ids[triplets.positive],
                         np.where(triplets.negative >= 0, ids[np.maximum(triplets.negative, 0)], -1)], axis=1)  # fmt: skip
        digest.update(rows[np.lexsort(rows.T[::-1])].astype("<i8").tobytes())
    return digest.hexdigest()
