"""A file that fails to read is reported on the driver as one line, without a Ray task failing.

A Ray Data task that raises makes the executor cancel the tasks still running, and Ray 2.60's
cancel can race the failed task's completion and abort the driver (ray-project/ray#54846; it
ended a CI run here). So these check the failure's route, not only its words: the DataError's
cause is the failure carried back as a block (:class:`ReadFailed`), not a Ray task error.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.config.data_section import DataSection
from pipeline.core.errors import DataError
from pipeline.data.corpus import load_clean_corpus
from pipeline.data.pairs import load_pairs
from pipeline.data.read_failures import ReadFailed


def _read_error(call) -> DataError:
    with pytest.raises(DataError) as caught:
        call()
    assert "\n" not in str(caught.value)
    assert isinstance(caught.value.__cause__, ReadFailed), repr(caught.value.__cause__)
    return caught.value


@pytest.mark.slow
def test_a_row_that_fails_after_the_first_block_names_the_row(ray_local, tmp_path: Path):
    """pyarrow reads 1 MiB blocks: the bad row at ~2.4 MB comes after blocks already read."""
    path = tmp_path / "late.tsv"
    good = "".join(f"anchor sentence {i}\tpositive sentence {i}\t1\n" for i in range(50_000))
    path.write_text(good + "only two\tfields\n", encoding="utf-8")
    assert path.stat().st_size > 2 * 2**20
    error = _read_error(lambda: load_pairs(DataSection(path=str(path), format="pairs_tsv")))
    assert str(error).startswith(f"data.path: cannot read {path} as pairs_tsv: CSV parse error: ")
    assert "Row #50001: Expected 3 columns, got 2" in str(error)


@pytest.mark.slow
def test_a_file_that_fails_in_its_first_block_fails_before_its_columns_are_checked(ray_local, tmp_path: Path):
    """The schema of such a read is the failure block's: the column checks must not read it as
    a file without the column."""
    jsonl = tmp_path / "latin1.jsonl"
    jsonl.write_bytes(b'{"text": "caf\xe9"}\n')
    error = _read_error(lambda: load_clean_corpus(DataSection(path=str(jsonl))))
    assert (
        str(error)
        == f"data.path: cannot read {jsonl} as jsonl: not valid UTF-8 (invalid continuation byte at byte 13)"
    )
    csv = tmp_path / "pairs.csv"
    csv.write_text('anchor,positive\n"never closed,b\n')
    error = _read_error(lambda: load_pairs(DataSection(path=str(csv))))
    assert str(error).startswith(f"data.path: cannot read {csv} as csv: CSV parse error: ")
    pool = tmp_path / "pool.tsv"
    pool.write_text("a\tb\nc\n")
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("x\ty\n")
    error = _read_error(
        lambda: load_pairs(
            DataSection(path=str(pairs), format="pairs_tsv", pool=str(pool), pool_format="pairs_tsv")
        )
    )
    assert str(error).startswith(f"data.pool: cannot read {pool} as pairs_tsv: CSV parse error: Row #2")
