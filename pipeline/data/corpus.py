"""The unsupervised corpus: one sentence per row, empty rows dropped and duplicates removed."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.config.data_section import DataSection
from pipeline.core.distinct import sorted_distinct
from pipeline.core.errors import DataError
from pipeline.data.formats import infer_format
from pipeline.data.placement import ANYWHERE, ReadNodes
from pipeline.data.read_failures import passing_read_failures
from pipeline.data.readers import read_corpus, reading
from pipeline.data.text_blocks import (
    DistinctTexts,
    TextColumns,
    block_columns,
    distinct_texts,
    materialized_blocks,
)
from pipeline.data.utf8 import INVALID_UTF8, _as_text, text_ids


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
        """What was dropped, as MLflow run tags (the sentences kept are the param ``data/rows``)."""
        return {
            "data.rows_read": self.rows_read,
            "data.empty_dropped": self.empty_dropped,
            "data.invalid_utf8_dropped": self.invalid_utf8_dropped,
            "data.duplicates_dropped": self.duplicates_dropped,
        }


@passing_read_failures
def _clean_batch(batch: pa.Table) -> pa.Table:
    """``(id, text, invalid_utf8)``: stripped text and its id; ``id`` -1 where nothing is left."""
    text, bad = _as_text(batch.column("text"))
    if INVALID_UTF8 in batch.column_names:
        read_bad = batch.column(INVALID_UTF8)
        bad = read_bad if bad is None else pc.or_(read_bad, bad)
    if bad is None:
        bad = pa.array(np.zeros(batch.num_rows, dtype=bool))
    text = pc.fill_null(pc.utf8_trim_whitespace(text), "")
    return pa.table({"id": text_ids(text), "text": text, INVALID_UTF8: bad})


def load_clean_corpus(
    section: DataSection, *, reads: ReadNodes = ANYWHERE
) -> tuple[DistinctTexts, CorpusStats]:
    """Read and clean the corpus with Ray Data; return its distinct sentences (sorted by id)
    as blocks in the object store, and what was dropped.

    The driver holds the ids only: reading, cleaning and hashing run in Ray Data tasks, and
    the distinct texts are taken out of the blocks that hold them
    (:func:`~pipeline.data.text_blocks.distinct_texts`). Lines (or cells) that are not valid
    UTF-8 are dropped and counted, not fatal: one bad line in a 10M-line crawl should not stop
    the job. ``data.max_rows`` keeps the first sentences by id, a fixed pseudo-random sample.
    ``reads``: whether the file is read on one node only (the one whose disk holds it).

    Raises:
        DataError: the corpus cannot be read, or nothing usable is left after cleaning.
    """
    assert section.path is not None
    with reading(section.path, infer_format(section.path, section.format)):
        ds = read_corpus(section, reads=reads).map_batches(
            _clean_batch, batch_format="pyarrow", num_cpus=section.tokenize_num_cpus
        )
        blocks = materialized_blocks(ds)
        read, block_rows = block_columns(blocks, ["id", INVALID_UTF8], section.tokenize_num_cpus)
    ids = read.column("id").to_numpy()
    invalid = read.column(INVALID_UTF8).to_numpy(zero_copy_only=False)
    distinct = sorted_distinct(ids[ids >= 0])
    kept = distinct[: section.max_rows]  # sorted by content hash: a fixed pseudo-random sample
    stats = CorpusStats(
        rows_read=len(ids),
        empty_dropped=int((~invalid & (ids < 0)).sum()),
        duplicates_dropped=int((ids >= 0).sum()) - len(distinct),
        sentences=len(kept),
        beyond_max_rows=len(distinct) - len(kept),
        invalid_utf8_dropped=int(invalid.sum()),
    )
    if stats.sentences == 0:
        raise DataError(f"data.path: {section.path} has no non-empty sentences ({stats.describe()})")
    source = TextColumns(blocks, [("text", "id")], [ids], block_rows)
    return distinct_texts([source], kept, section.tokenize_num_cpus), stats
