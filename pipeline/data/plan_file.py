"""A mined corpus plan on storage: written a partition at a time, read whole where the shares
are cut.

The file is Parquet with one row a batch (its corpus positions, a list column), so the plan's
batch sizes are the lists' lengths and a writer needs only the batches it is given. The miner
writes each partition's batches as soon as they are planned (:class:`PlanFileWriter`), and
the batches' final order, a seeded permutation over every batch, is applied where the file is
read (:func:`read_plan_file`): no step of a refresh holds every row of the plan. Any Parquet
reader opens it (``pyarrow.parquet.read_table(uri)``: column ``rows``, int32 positions up to
2^31 rows as :func:`~pipeline.core.positions.position_dtype` sets; older files' int64 still read).
"""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.batching.plan import BatchPlan
from pipeline.core.positions import position_dtype
from pipeline.data.formats import filesystem_of


class PlanFileWriter:
    """Writes a plan batch after batch to ``uri`` (any URI pyarrow writes; None: memory, which
    :meth:`close` reads back), the batches to be read in the order ``reorder`` seeds
    (:meth:`~pipeline.batching.plan.BatchPlan.reordered`; None: as written), positions among
    ``corpus_rows`` rows."""

    def __init__(self, uri: str | None, *, sampler: str, reorder: int | None, corpus_rows: int):
        metadata = {"sampler": sampler, "reorder": "" if reorder is None else str(reorder)}
        self._positions = pa.from_numpy_dtype(position_dtype(corpus_rows))
        schema = pa.schema([("rows", pa.list_(self._positions))], metadata=metadata)
        self.uri = uri
        if uri is None:
            self._sink = pa.BufferOutputStream()
        else:
            filesystem, path = filesystem_of(uri)
            filesystem.create_dir(path.rsplit("/", 1)[0], recursive=True)
            self._sink = filesystem.open_output_stream(path)
        self._writer = pq.ParquetWriter(self._sink, schema)

    def write(self, plan: BatchPlan) -> None:
        """Append ``plan``'s batches (a partition's, in corpus positions)."""
        offsets = np.concatenate([[0], np.cumsum(plan.sizes)]).astype(np.int32)
        batches = pa.ListArray.from_arrays(pa.array(offsets), pa.array(plan.rows, self._positions))
        self._writer.write_table(pa.Table.from_arrays([batches], schema=self._writer.schema))

    def close(self, version: int) -> str | BatchPlan:
        """Finish the file: its URI, or, written to memory, the plan it holds (``version``)."""
        self._writer.close()
        if self.uri is not None:
            self._sink.close()
            return self.uri
        return _plan_of(pq.read_table(pa.BufferReader(self._sink.getvalue())), version)


def read_plan_file(uri: str, version: int) -> BatchPlan:
    """The plan :class:`PlanFileWriter` wrote to ``uri``, its batches in their final order."""
    filesystem, path = filesystem_of(uri)
    if path.endswith(".npz"):  # written whole, by a run checkpointed before plans were Parquet
        with filesystem.open_input_file(path) as stream:
            saved = np.load(io.BytesIO(stream.read()))
        return BatchPlan(version, saved["rows"], saved["sizes"], str(saved["sampler"]))
    return _plan_of(pq.read_table(path, filesystem=filesystem), version)


def _plan_of(table: pa.Table, version: int) -> BatchPlan:
    metadata = {key.decode(): value.decode() for key, value in (table.schema.metadata or {}).items()}
    batches = table.column("rows")
    plan = BatchPlan(
        version,
        pc.list_flatten(batches).to_numpy(),
        pc.list_value_length(batches).to_numpy().astype(np.int64),
        metadata["sampler"],
    )
    return plan.reordered(int(metadata["reorder"])) if metadata["reorder"] else plan
