"""The refresh samplers (``random``, ``knn``) on a synthetic corpus of 20 topics: every plan
covers each row once in balanced batches, keeps flagged false negatives apart and is seeded;
``knn`` makes harder batches than random ones."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from pipeline.batching.plan import BatchPlan, balanced_batch_sizes, padding_share
from pipeline.batching.registry import SAMPLERS, build_plan
from pipeline.batching.sampler_inputs import SamplerInputs
from pipeline.batching.samplers import neighbourhood_plan, random_plan
from pipeline.batching.separation import separate_false_negatives
from pipeline.mining.plan_quality import false_negative_pairs

N, K, BATCH = 2000, 32, 64


def _topics(n: int = N, topics: int = 20, dim: int = 32, noise: float = 1.0, seed: int = 0) -> np.ndarray:
    """``(n, dim)`` unit vectors around ``topics`` random centres."""
    rng = np.random.default_rng(seed)
    topic = rng.integers(topics, size=n)
    x = rng.normal(size=(topics, dim))[topic] + noise * rng.normal(size=(n, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _knn(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact k nearest other rows by cosine, nearest first: ``(indices, scores)``."""
    similarity = x @ x.T
    np.fill_diagonal(similarity, -np.inf)
    indices = np.argsort(-similarity, axis=1, kind="stable")[:, :k]
    return indices, np.take_along_axis(similarity, indices, axis=1)


def _inputs(x: np.ndarray, k: int, flagged: int = 3) -> SimpleNamespace:
    """The samplers' inputs as the miner makes them: each row's ``flagged`` nearest are its
    likely paraphrases (kept apart, not negatives), the rest of its k-NN its negatives."""
    indices, scores = _knn(x, k)
    first = np.arange(k) < flagged
    return SimpleNamespace(
        indices=indices,
        scores=scores,
        neighbours=np.where(first, -1, indices),
        false_negatives=np.where(first, indices, -1),
    )


@pytest.fixture(scope="module")
def corpus() -> SimpleNamespace:
    x = _topics()
    return SimpleNamespace(x=x, **vars(_inputs(x, K)))


def _plan(name: str, c: SimpleNamespace, seed: int, false_negatives=None) -> BatchPlan:
    """The registry's sampler ``name`` (the miner's own factory) on the test corpus."""
    return build_plan(name, SamplerInputs(c.neighbours, c.scores, false_negatives, BATCH, seed, 1))


def _mean_in_batch_cosine(x: np.ndarray, plan: BatchPlan) -> float:
    """Mean cosine over every ordered pair of distinct rows sharing a batch."""
    total = pairs = 0.0
    for rows in plan.batches():
        gram = x[rows] @ x[rows].T
        total += gram.sum() - np.trace(gram)
        pairs += len(rows) * (len(rows) - 1)
    return total / pairs


def _hardness(name: str, c: SimpleNamespace, seeds=(0, 1), false_negatives=None) -> float:
    return float(np.mean([_mean_in_batch_cosine(c.x, _plan(name, c, s, false_negatives)) for s in seeds]))


def _batch_sets(plan: BatchPlan) -> set[frozenset[int]]:
    return {frozenset(b.tolist()) for b in plan.batches()}


@pytest.mark.parametrize("flagged", [False, True], ids=["plain", "flagged"])
@pytest.mark.parametrize("name", SAMPLERS)
def test_every_row_once_in_balanced_batches(corpus, name, flagged):
    plan = _plan(name, corpus, seed=5, false_negatives=corpus.false_negatives if flagged else None)
    assert sorted(plan.rows.tolist()) == list(range(N))
    # The same batch sizes as every other sampler, whatever their order.
    assert sorted(plan.sizes.tolist()) == sorted(balanced_batch_sizes(N, BATCH).tolist())
    assert [len(b) for b in plan.batches()] == plan.sizes.tolist()
    assert plan.sampler == name and plan.version == 1


@pytest.mark.parametrize("name", SAMPLERS)
def test_flagged_pairs_never_share_a_batch(corpus, name):
    """Each row flags its 3 nearest: unguarded, every sampler puts many of them together
    (even random batches: 6,000 pairs x 63/1,999), guarded none."""
    fn = corpus.false_negatives
    assert false_negative_pairs(_plan(name, corpus, seed=2), fn) > 100
    assert false_negative_pairs(_plan(name, corpus, seed=2, false_negatives=fn), fn) == 0


@pytest.mark.parametrize("name", SAMPLERS)
def test_plans_are_seeded(corpus, name):
    fn = corpus.false_negatives
    plan = _plan(name, corpus, seed=7, false_negatives=fn)
    again = _plan(name, corpus, seed=7, false_negatives=fn)
    assert np.array_equal(plan.rows, again.rows) and np.array_equal(plan.sizes, again.sizes)
    assert plan.fingerprint() == again.fingerprint()
    other = _plan(name, corpus, seed=8, false_negatives=fn)
    assert _batch_sets(other) != _batch_sets(plan)


def test_knn_makes_harder_batches_than_random(corpus):
    """Mean in-batch cosine: knn (whole neighbourhoods) > random, by a clear margin; random
    batches of topic vectors are near 0."""
    fn = corpus.false_negatives
    hardness = {name: _hardness(name, corpus, false_negatives=fn) for name in ("random", "knn")}
    assert hardness["knn"] > hardness["random"] + 0.1
    assert abs(hardness["random"]) < 0.05


@pytest.mark.parametrize("name", SAMPLERS)
def test_a_corpus_too_small_to_separate_keeps_its_plan_shape(name):
    """Tiny-corpus fallback: 10 rows in 2 batches, each flagging every other row. No plan can
    separate them; each sampler still covers every row once in balanced batches."""
    c = _inputs(_topics(n=10, topics=2, seed=3), 9, flagged=0)
    everyone = np.array([[j for j in range(10) if j != i] for i in range(10)])
    inputs = SamplerInputs(c.neighbours, c.scores, everyone, batch_size=5, seed=1, version=1)
    plan = {
        "random": lambda: random_plan(10, 5, 1, version=1, false_negatives=everyone),
        "knn": lambda: neighbourhood_plan(inputs),
    }[name]()
    assert sorted(plan.rows.tolist()) == list(range(10))
    assert plan.sizes.tolist() == [5, 5]
    assert false_negative_pairs(plan, everyone) == 2 * 2 * (5 * 4 // 2)


def test_random_plan_without_false_negatives_is_unchanged(corpus):
    """Fingerprints of plans made before ``false_negatives`` existed (same inputs)."""
    lengths = np.random.default_rng(7).integers(5, 60, size=N)
    assert random_plan(N, BATCH, seed=3).hex_fingerprint() == "e5b045360ef6"
    assert random_plan(N, BATCH, seed=3, lengths=lengths, group_batches=8).hex_fingerprint() == "8bc7961b55ab"
    assert random_plan(N, BATCH, seed=3, false_negatives=None).hex_fingerprint() == "e5b045360ef6"
    assert (
        neighbourhood_plan(
            SamplerInputs(corpus.neighbours, corpus.scores, None, BATCH, 3, 1)
        ).hex_fingerprint()
        == "a60fc20aa195"
    )


def test_random_plan_moves_only_the_rows_it_separates(corpus):
    fn = corpus.false_negatives
    plain = random_plan(N, BATCH, seed=3)
    separated = random_plan(N, BATCH, seed=3, false_negatives=fn)
    assert np.array_equal(plain.sizes, separated.sizes)
    moved = (plain.rows != separated.rows).sum()
    assert 0 < moved <= 2 * false_negative_pairs(plain, fn)


def test_grouped_random_plan_separates_with_rows_of_the_same_length(corpus):
    """Swaps with rows of equal length (else ones that widen no batch) keep every batch's
    width, so padding; a hub row flagged by rows of every batch its length is in can
    still need a plain swap, so padding may move a little."""
    fn = corpus.false_negatives
    lengths = np.random.default_rng(7).integers(5, 60, size=N)
    plain = random_plan(N, BATCH, seed=3, lengths=lengths, group_batches=8)
    separated = random_plan(N, BATCH, seed=3, lengths=lengths, group_batches=8, false_negatives=fn)
    assert false_negative_pairs(plain, fn) > 100
    assert false_negative_pairs(separated, fn) == 0
    assert padding_share(separated, lengths) == pytest.approx(padding_share(plain, lengths), abs=0.005)
    assert lengths[separated.batch(0)].max() == lengths.max()
    assert sorted(separated.rows.tolist()) == list(range(N))


def test_separation_without_conflicts_changes_nothing_and_draws_nothing():
    batches = [np.array([0, 1]), np.array([2, 3])]
    fn = np.array([[2], [3], [0], [1]])  # flagged pairs already apart
    rng = np.random.default_rng(0)
    state = rng.bit_generator.state
    separated, left = separate_false_negatives(batches, fn, rng)
    assert left == 0 and all(np.array_equal(a, b) for a, b in zip(separated, batches, strict=True))
    assert rng.bit_generator.state == state


def test_separation_reports_what_it_cannot_separate():
    """Rows 0-5 all flag each other: 6 rows in 3 batches, so at least 3 pairs (6 flags) stay;
    a swap is only made if it creates no conflict, so it may leave more than that."""
    fn = np.full((12, 5), -1)
    for row in range(6):
        fn[row] = [j for j in range(6) if j != row]
    batches = [np.arange(0, 4), np.arange(4, 8), np.arange(8, 12)]
    separated, left = separate_false_negatives(batches, fn, np.random.default_rng(0))
    plan = BatchPlan(0, np.concatenate(separated), np.array([4, 4, 4]))
    assert sorted(plan.rows.tolist()) == list(range(12))
    before = false_negative_pairs(BatchPlan(0, np.arange(12), np.array([4, 4, 4])), fn)
    assert before == 4 * 3 + 2 * 1
    assert left == false_negative_pairs(plan, fn)
    assert 6 <= left < before


@pytest.mark.parametrize(("rows", "batch", "world"), [(203, 16, 1), (203, 16, 3), (77, 5, 7), (50, 8, 8)])
def test_padding_share_pads_each_workers_slice_to_its_own_longest_row(rows, batch, world):
    from pipeline.batching.plan import worker_slices

    rng = np.random.default_rng(rows + world)
    plan = random_plan(rows, batch, seed=2)
    for lengths in (rng.integers(1, 30, rows), rng.integers(1, 30, (rows, 2))):
        columns = lengths.reshape(rows, -1)
        real = padded = 0
        for rows_of_batch in plan.batches():  # slice by slice, each column on its own
            start = 0
            for size in worker_slices(len(rows_of_batch), world):
                widths = columns[rows_of_batch[start : start + size]]
                start += size
                if size:
                    real += int(widths.sum())
                    padded += size * int(widths.max(axis=0).sum())
        assert padding_share(plan, lengths, world) == pytest.approx(1 - real / padded, abs=1e-12)
