"""The distinct texts come out of the cleaned blocks as consecutive ranges of positions, each
sorted by id, whatever order the ids had in the blocks they were read into: what the tokenizers
then keep in order is the corpus in position order, with no shuffle of the tokenized rows."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import ray

from pipeline.data.text_blocks import TextColumns, distinct_texts


def _blocks(texts: list[list[str | None]], rng: np.random.Generator) -> TextColumns:
    """Blocks of an ``(a, a_id, b, b_id)`` table (two text columns, as a pairs file has), the
    ids random 63-bit values fixed per text (-1 for no text)."""
    id_of: dict[str, int] = {}
    tables, ids_a, ids_b = [], [], []
    for block in texts:
        half = len(block) // 2
        columns = {"a": block[:half], "b": block[half : 2 * half]}
        ids = {
            name: np.array(
                [-1 if t is None else id_of.setdefault(t, int(rng.integers(0, 2**62))) for t in values],
                dtype=np.int64,
            )
            for name, values in columns.items()
        }
        tables.append(pa.table({"a": columns["a"], "a_id": ids["a"], "b": columns["b"], "b_id": ids["b"]}))
        ids_a.append(ids["a"])
        ids_b.append(ids["b"])
    return TextColumns(
        [ray.put(t) for t in tables],
        [("a", "a_id"), ("b", "b_id")],
        [np.concatenate(ids_a), np.concatenate(ids_b)],
        np.array([t.num_rows for t in tables], dtype=np.int64),
    )


@pytest.mark.parametrize(("range_rows", "piece_rows"), [(7, 1), (7, 5), (40, 1), (40, 100), (10_000, 1)])
def test_distinct_texts_are_ranges_of_positions_sorted_by_id(ray_local, monkeypatch, range_rows, piece_rows):
    """``piece_rows``: 1 takes each block alone; more takes several blocks in one task."""
    rng = np.random.default_rng(5)
    words = [f"text {i}" for i in range(300)]
    # Six blocks of uneven sizes; texts repeat across blocks and columns, and some cells are empty.
    texts = [
        [words[i] if i % 11 else None for i in rng.integers(0, 300, size=size)]
        for size in (90, 4, 130, 61, 1, 80)
    ]
    source = _blocks(texts, rng)
    every = np.concatenate(source.ids)
    present = np.unique(every[every >= 0])
    wanted = rng.permutation(present)[: len(present) - 20]  # unsorted, and not every id
    monkeypatch.setattr("pipeline.data.text_blocks.RANGE_ROWS", range_rows)
    monkeypatch.setattr("pipeline.data.text_blocks.MIN_RANGE_ROWS", range_rows)
    monkeypatch.setattr("pipeline.data.text_blocks.PIECE_ROWS", piece_rows)

    corpus = distinct_texts([source], wanted, num_cpus=1)

    tables = ray.get(corpus.blocks)
    ranges = -(-len(wanted) // range_rows)
    assert len(tables) == ranges
    ids = np.concatenate([t.column("id").to_numpy() for t in tables])
    # Block after block, position i is the i-th smallest wanted id, without a sort on the reader.
    assert np.array_equal(ids, np.sort(wanted)) and np.array_equal(corpus.ids, np.sort(wanted))
    text_of = {}
    for table in ray.get(source.blocks):
        for text, id_column in (("a", "a_id"), ("b", "b_id")):
            text_of.update(
                zip(table.column(id_column).to_pylist(), table.column(text).to_pylist(), strict=True)
            )
    got = [text for t in tables for text in t.column("text").to_pylist()]
    assert got == [text_of[i] for i in ids.tolist()]
    assert [t.num_rows for t in tables[:-1]] == [-(-len(wanted) // ranges)] * (ranges - 1)


def test_a_small_corpus_is_cut_so_every_cpu_tokenizes(ray_local, monkeypatch):
    """Fewer texts than one range still make a range per CPU (``ray_local`` has 4), each of at
    least ``MIN_RANGE_ROWS``."""
    from pipeline.data.text_blocks import range_count

    monkeypatch.setattr("pipeline.data.text_blocks.MIN_RANGE_ROWS", 10)
    assert range_count(1_000, num_cpus=1) == 4
    assert range_count(1_000, num_cpus=2) == 2
    assert range_count(25, num_cpus=1) == 2
    assert range_count(5, num_cpus=1) == 1
    assert range_count(0, num_cpus=1) == 1


def test_blocks_are_taken_in_groups_of_enough_picked_rows() -> None:
    from pipeline.data.text_blocks import _block_groups

    def picks(*rows: int) -> dict[int, list]:
        return {b: [("t", "i", np.arange(n))] for b, n in enumerate(rows) if n}

    assert _block_groups(picks(3, 3, 3, 3, 3), rows_per_group=5) == [[0, 1], [2, 3], [4]]
    assert _block_groups(picks(6, 0, 1, 9), rows_per_group=5) == [[0], [2, 3]]
    assert _block_groups(picks(1, 1), rows_per_group=100) == [[0, 1]]
    assert _block_groups({}, rows_per_group=5) == []
