"""A mined plan on storage: written in parts, read whole in its final order, by URI or from
memory; a plan written whole by an older run still reads."""

from __future__ import annotations

import io

import numpy as np
import pyarrow.parquet as pq

from pipeline.batching.plan import BatchPlan
from pipeline.data.plan_file import PlanFileWriter, read_plan_file


def _parts() -> list[BatchPlan]:
    rng = np.random.default_rng(0)
    rows = rng.permutation(50)
    return [
        BatchPlan(1, rows[:20], np.array([7, 7, 6]), "knn"),
        BatchPlan(1, rows[20:], np.array([8, 8, 7, 7]), "knn"),
    ]


def test_a_plan_written_in_parts_reads_as_the_whole_plan_reordered(tmp_path):
    parts = _parts()
    whole = BatchPlan(
        2, np.concatenate([p.rows for p in parts]), np.concatenate([p.sizes for p in parts]), "knn"
    )
    for uri in (str(tmp_path / "plain" / "v2-plan.parquet"), f"file://{tmp_path}/uri/v2-plan.parquet", None):
        for reorder in (None, 17):
            writer = PlanFileWriter(uri, sampler="knn", reorder=reorder, corpus_rows=50)
            for part in parts:
                writer.write(part)
            closed = writer.close(version=2)
            plan = closed if uri is None else read_plan_file(closed, version=2)
            expected = whole if reorder is None else whole.reordered(reorder)
            np.testing.assert_array_equal(plan.rows, expected.rows)
            np.testing.assert_array_equal(plan.sizes, expected.sizes)
            assert (plan.version, plan.sampler) == (2, "knn")
            # Half of int64's bytes, wherever the plan is read whole (each rank's share task).
            assert plan.rows.dtype == np.int32
    # Any Parquet reader opens it: a batch a row, as written.
    table = pq.read_table(tmp_path / "plain" / "v2-plan.parquet")
    assert table.column("rows").to_pylist() == [b.tolist() for p in parts for b in p.batches()]


def test_a_plan_written_whole_by_an_older_run_still_reads(tmp_path):
    plan = _parts()[0]
    buffer = io.BytesIO()
    np.savez(buffer, rows=plan.rows, sizes=plan.sizes, sampler=np.array(plan.sampler))
    (tmp_path / "v3-plan.npz").write_bytes(buffer.getvalue())
    read = read_plan_file(str(tmp_path / "v3-plan.npz"), version=3)
    np.testing.assert_array_equal(read.rows, plan.rows)
    assert (read.version, read.sampler, read.sizes.tolist()) == (3, "knn", [7, 7, 6])


def test_positions_past_int32_are_written_as_int64_and_such_a_plan_reads_the_same(tmp_path):
    """A corpus of more than 2^31 rows keeps int64 positions (as every plan file did before);
    the plan it reads is the int32 one's, fingerprint included (the run's plan tags)."""
    parts = _parts()
    read = {}
    for corpus_rows in (50, 2**31 + 1):
        uri = str(tmp_path / f"{corpus_rows}" / "v2-plan.parquet")
        writer = PlanFileWriter(uri, sampler="knn", reorder=5, corpus_rows=corpus_rows)
        for part in parts:
            writer.write(part)
        read[corpus_rows] = read_plan_file(writer.close(version=2), version=2)
    small, large = read[50], read[2**31 + 1]
    assert (small.rows.dtype, large.rows.dtype) == (np.int32, np.int64)
    np.testing.assert_array_equal(small.rows, large.rows)
    assert small.fingerprint() == large.fingerprint()
