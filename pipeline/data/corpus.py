"""The unsupervised corpus: one sentence per row, empty rows dropped and duplicates removed."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import ray

from pipeline.config.data_section import DataSection
from pipeline.core.errors import DataError
from pipeline.data.formats import infer_format
from pipeline.data.readers import read_corpus, reading
from pipeline.data.utf8 import INVALID_UTF8, _as_text, stable_row_id


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


def load_clean_corpus(section: DataSection) -> tuple[pa.Table, CorpusStats]:
    """Read and clean the corpus with Ray Data; return ``(id, text)`` sorted by id, unique.

    Lines (or cells) that are not valid UTF-8 are dropped and counted, not fatal: one bad
    line in a 10M-line crawl should not stop the job.

    Raises:
        DataError: the corpus cannot be read, or nothing usable is left after cleaning.
    """
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
