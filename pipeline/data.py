"""Corpus stage: Ray Data readers, cleaning, exact dedup, stable ids, tokenization.

Flow: read (txt/csv/tsv/jsonl/parquet, local or any pyarrow filesystem URI) -> clean
(strip, content-hash id) -> drop empty and duplicate rows -> tokenize in ``map_batches``
-> one Arrow table ``(id, text, input_ids)`` sorted by id, put in the object store once and
shared by the train workers and the miner. Training addresses rows by position in that
table, which is why the corpus is materialised rather than streamed into the train loop.
"""

from __future__ import annotations

import hashlib
import os
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


class DataError(ValueError):
    """The corpus cannot be used; the message says why and names the config key."""


@dataclass
class CorpusStats:
    rows_read: int
    empty_dropped: int
    duplicates_dropped: int
    sentences: int
    beyond_max_rows: int = 0

    def describe(self) -> str:
        limited = f" (data.max_rows left out {self.beyond_max_rows})" if self.beyond_max_rows else ""
        return (
            f"read {self.rows_read} rows; dropped {self.empty_dropped} empty and "
            f"{self.duplicates_dropped} exact duplicates; {self.sentences} sentences remain{limited}"
        )


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


def check_corpus_path(path: str) -> None:
    """Fail fast, before Ray starts, when the corpus path does not exist."""
    try:
        filesystem, inner = pafs.FileSystem.from_uri(path)
    except (pa.ArrowInvalid, ValueError):
        filesystem, inner = pafs.LocalFileSystem(), os.path.abspath(path)
    try:
        info = filesystem.get_file_info(inner)
    except OSError as exc:
        raise DataError(f"data.path: cannot access {path}: {str(exc).splitlines()[0]}") from None
    if info.type == pafs.FileType.NotFound:
        raise DataError(f"data.path: {path} does not exist")


def stable_row_id(text: str) -> int:
    """63-bit content hash: the same sentence gets the same id in every run and on every node."""
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF_FFFF_FFFF


def read_dataset(path: str, fmt: str) -> Any:
    """A Ray Dataset over a file, folder or URI in one of the supported formats.

    Text files give one column, ``text``; the others keep their own columns.
    """
    import ray.data

    if fmt == "text":
        return ray.data.read_text(path, drop_empty_lines=False)
    if fmt in ("csv", "tsv"):
        import pyarrow.csv as pacsv

        return ray.data.read_csv(
            path, parse_options=pacsv.ParseOptions(delimiter="\t" if fmt == "tsv" else ",")
        )
    if fmt == "jsonl":
        return ray.data.read_json(path, lines=True)
    return ray.data.read_parquet(path)


def require_columns(ds: Any, path: str, wanted: dict[str, str]) -> None:
    """Fail with the config key when a column is missing; ``wanted`` maps key -> column."""
    names = ds.schema().names
    for key, column in wanted.items():
        if column not in names:
            raise DataError(f"{key}: column {column!r} not in {path} (columns: {', '.join(names)})")


def read_corpus(section: DataSection) -> Any:
    """A Ray Dataset with one string column ``text`` (unclean)."""
    assert section.path is not None
    fmt = infer_format(section.path, section.format)
    ds = read_dataset(section.path, fmt)
    if fmt == "text":
        return ds
    require_columns(ds, section.path, {"data.text_column": section.text_column})
    ds = ds.select_columns([section.text_column])
    return ds.rename_columns({section.text_column: "text"}) if section.text_column != "text" else ds


def _clean_batch(batch: pa.Table) -> pa.Table:
    text = batch.column("text")
    if not pa.types.is_string(text.type) and not pa.types.is_large_string(text.type):
        text = pc.cast(text, pa.string())
    text = pc.fill_null(pc.utf8_trim_whitespace(text), "")
    ids = pa.array([stable_row_id(t) if t else 0 for t in text.to_pylist()], type=pa.int64())
    return pa.table({"id": ids, "text": text})


def load_clean_corpus(section: DataSection) -> tuple[pa.Table, CorpusStats]:
    """Read and clean the corpus with Ray Data; return ``(id, text)`` sorted by id, unique.

    Raises:
        DataError: nothing usable is left after cleaning.
    """
    import ray

    ds = read_corpus(section).map_batches(
        _clean_batch, batch_format="pyarrow", num_cpus=section.tokenize_num_cpus
    )
    tables = [t for t in ray.get(ds.to_arrow_refs()) if t.num_rows]
    raw = (
        pa.concat_tables(tables)
        if tables
        else pa.table({"id": pa.array([], pa.int64()), "text": pa.array([], pa.string())})
    )
    rows_read = raw.num_rows
    non_empty = raw.filter(pc.not_equal(pc.utf8_length(raw.column("text")), 0))
    ids = non_empty.column("id").to_numpy()
    unique_ids, first = np.unique(ids, return_index=True)
    if section.max_rows is not None:
        # Sorted by content hash, the first rows are a fixed pseudo-random sample.
        first = first[: section.max_rows]
    corpus = non_empty.take(pa.array(first))  # np.unique sorts, so the table is sorted by id
    stats = CorpusStats(
        rows_read=rows_read,
        empty_dropped=rows_read - non_empty.num_rows,
        duplicates_dropped=non_empty.num_rows - len(unique_ids),
        sentences=corpus.num_rows,
        beyond_max_rows=len(unique_ids) - corpus.num_rows,
    )
    if corpus.num_rows == 0:
        raise DataError(f"data.path: {section.path} has no non-empty sentences ({stats.describe()})")
    return corpus.combine_chunks(), stats


def tokenize_table(batch: pa.Table, tokenizer: Any, max_seq_len: int) -> pa.Table:
    """Append ``input_ids`` (list<int32>, special tokens included, truncated) to a ``text`` table."""
    encoded = tokenizer(
        batch.column("text").to_pylist(),
        truncation=True,
        max_length=max_seq_len,
        padding=False,
        return_attention_mask=False,
        return_token_type_ids=False,
    )["input_ids"]
    return batch.append_column("input_ids", pa.array(encoded, type=pa.list_(pa.int32())))


def _clean_text(column: Any) -> Any:
    if not pa.types.is_string(column.type) and not pa.types.is_large_string(column.type):
        column = pc.cast(column, pa.string())
    return pc.utf8_trim_whitespace(pc.fill_null(column, ""))


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
    ds = read_dataset(section.path, fmt)
    negatives = None
    if fmt == "text":
        table = pa.concat_tables(ray.get(ds.to_arrow_refs()))
        anchors = positives = _clean_text(table.column("text"))
    else:
        columns = {
            "data.anchor_column": section.anchor_column,
            "data.positive_column": section.positive_column,
        }
        if section.negative_column:
            columns["data.negative_column"] = section.negative_column
        require_columns(ds, section.path, columns)
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
        return tokenize_table(batch, self.tokenizer, self.max_seq_len)


def tokenize_corpus(corpus: pa.Table, tokenizer: Any, section: DataSection) -> pa.Table:
    """Tokenize ``(id, text)`` with Ray Data ``map_batches`` over a pool of tokenizer actors;
    returns ``(id, text, input_ids)`` in the input's row order (sorted by id)."""
    import ray
    import ray.data

    rows_per_block = max(section.tokenize_batch_size, 1)
    blocks = [corpus.slice(start, rows_per_block) for start in range(0, corpus.num_rows, rows_per_block)]
    ds = ray.data.from_arrow_refs([ray.put(block) for block in blocks]).map_batches(
        _TokenizeBatches,
        batch_format="pyarrow",
        batch_size=section.tokenize_batch_size,
        num_cpus=section.tokenize_num_cpus,
        compute=ray.data.ActorPoolStrategy(min_size=1, max_size=section.tokenize_actors),
        fn_constructor_kwargs={"tokenizer": tokenizer, "max_seq_len": section.max_seq_len},
    )
    tokenized = pa.concat_tables(ray.get(ds.to_arrow_refs()))
    # Blocks may finish out of order; ids are unique, so sorting restores the input order.
    return tokenized.sort_by("id").combine_chunks()


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
