"""The refresh samplers (``random``, ``knn``, ``rwr``, ``clusters``, ``mixed``) on a synthetic
corpus of 20 topics: every plan covers each row once in balanced batches, keeps flagged false
negatives apart and is seeded; the graph samplers make harder batches than random ones."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from pipeline.batching.cluster_sampler import cluster_plan
from pipeline.batching.graph_samplers import mixed_plan, random_walk_plan
from pipeline.batching.plan import BatchPlan, balanced_batch_sizes, padding_share
from pipeline.batching.registry import SAMPLERS, build_plan
from pipeline.batching.sampler_inputs import SamplerInputs
from pipeline.batching.samplers import neighbourhood_plan, random_plan
from pipeline.batching.separation import separate_false_negatives
from pipeline.mining.plan_quality import false_negative_pairs

N, K, BATCH = 2000, 32, 64


def _topics(n: int = N, topics: int = 20, dim: int = 32, noise: float = 1.0, seed: int = 0):
    """Unit vectors around ``topics`` random centres: ``(x, topic of each row)``."""
    rng = np.random.default_rng(seed)
    topic = rng.integers(topics, size=n)
    x = rng.normal(size=(topics, dim))[topic] + noise * rng.normal(size=(n, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32), topic


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
    x, topic = _topics()
    return SimpleNamespace(x=x, topic=topic, **vars(_inputs(x, K)))


def _plan(name: str, c: SimpleNamespace, seed: int, false_negatives=None, **options) -> BatchPlan:
    """The registry's sampler ``name`` (the miner's own factory) on the test corpus."""
    renamed = {"neighbour_share": "mixed_share", "group_size": "mixed_group_size"}
    inputs = SamplerInputs(c.neighbours, c.scores, false_negatives, BATCH, seed, 1, clusters=c.topic,
                           **{renamed.get(k, k): v for k, v in options.items()})  # fmt: skip
    return build_plan(name, inputs)


def _cluster_inputs(c: SimpleNamespace, false_negatives=None, **fields) -> SamplerInputs:
    """The test corpus's inputs for :func:`cluster_plan` called directly: its topics as the
    clusters, seed 0, version 1."""
    fields = {"clusters": c.topic, **fields}
    return SamplerInputs(c.neighbours, c.scores, false_negatives, BATCH, 0, 1, **fields)


def _mean_in_batch_cosine(x: np.ndarray, plan: BatchPlan) -> float:
    """Mean cosine over every ordered pair of distinct rows sharing a batch."""
    total = pairs = 0.0
    for rows in plan.batches():
        gram = x[rows] @ x[rows].T
        total += gram.sum() - np.trace(gram)
        pairs += len(rows) * (len(rows) - 1)
    return total / pairs


def _hardness(name: str, c: SimpleNamespace, seeds=(0, 1), **options) -> float:
    return float(np.mean([_mean_in_batch_cosine(c.x, _plan(name, c, s, **options)) for s in seeds]))


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


def test_graph_samplers_make_harder_batches_than_random(corpus):
    """Mean in-batch cosine: knn (whole neighbourhoods) > rwr (a walk's neighbourhood) >
    mixed (half the batch in groups of 4) > random, each by a clear margin."""
    fn = corpus.false_negatives
    hardness = {
        name: _hardness(name, corpus, false_negatives=fn) for name in ("random", "knn", "rwr", "mixed")
    }
    assert hardness["knn"] > hardness["rwr"] + 0.03
    assert hardness["rwr"] > hardness["mixed"] + 0.03
    assert hardness["mixed"] > hardness["random"] + 0.005
    assert abs(hardness["random"]) < 0.05 < hardness["rwr"]


def test_restart_probability_trades_locality_against_reach(corpus):
    """Restarts go back to the batch's start row (BatchSampler): near 1 the walk samples the
    start's direct neighbours. With k = 32 < batch 64 those run out, the walk jumps to
    unrelated rows, and batches drift towards random as restarts grow more frequent; with
    k = 100 the start's neighbours can fill the batch, and frequent restarts make the
    harder batches, a restart-free walk wandering off."""
    fn = corpus.false_negatives
    few = {p: _hardness("rwr", corpus, false_negatives=fn, restart_probability=p) for p in (0.05, 0.5, 0.95)}
    random = _hardness("random", corpus)
    assert few[0.05] > few[0.5] > few[0.95] + 0.02 > random + 0.03
    assert few[0.05] > few[0.95] + 0.03
    wide = SimpleNamespace(x=corpus.x, topic=corpus.topic, **vars(_inputs(corpus.x, 100)))
    many = {
        p: _hardness("rwr", wide, false_negatives=wide.false_negatives, restart_probability=p)
        for p in (0.0, 0.8)
    }
    assert many[0.8] > many[0.0] + 0.03


def test_restart_probability_must_be_a_probability(corpus):
    with pytest.raises(ValueError, match="restart_probability"):
        _plan("rwr", corpus, seed=0, restart_probability=1.5)


def test_mixed_share_zero_is_the_random_partition_and_one_all_groups(corpus):
    # Share 0: consecutive rows of the same random order as random_plan's, batch order aside.
    assert _batch_sets(_plan("mixed", corpus, seed=4, neighbour_share=0.0)) == _batch_sets(
        random_plan(N, BATCH, seed=4)
    )
    fn = corpus.false_negatives
    share = {s: _hardness("mixed", corpus, false_negatives=fn, neighbour_share=s) for s in (0.0, 0.5, 1.0)}
    assert share[1.0] > share[0.5] + 0.003 > share[0.0] + 0.006
    # Groups of 2 (a row and its nearest negative) are less than groups of 8.
    assert _hardness("mixed", corpus, neighbour_share=1.0, group_size=8) > _hardness(
        "mixed", corpus, neighbour_share=1.0, group_size=2
    )
    with pytest.raises(ValueError, match="neighbour_share"):
        _plan("mixed", corpus, seed=0, neighbour_share=-0.1)


def _clusters_per_batch(plan: BatchPlan, clusters: np.ndarray) -> np.ndarray:
    return np.array([len(np.unique(clusters[b])) for b in plan.batches()])


@pytest.mark.parametrize("per_batch", [2, 4, 8])
def test_cluster_batches_hold_few_clusters(corpus, per_batch):
    """Clusters of about 100 rows, batches of 64: each batch draws on ``per_batch`` clusters
    (one more where a lane's cluster ends), and flagged pairs still go apart. Flags here are
    the miner's kind: neighbours above a similarity threshold (about one row in five has one)."""
    plain = cluster_plan(_cluster_inputs(corpus, clusters_per_batch=per_batch))
    assert _clusters_per_batch(plain, corpus.topic).max() <= per_batch + 1
    flagged = np.where(corpus.scores > 0.8, corpus.indices, -1)
    assert false_negative_pairs(plain, flagged) > 0
    plan = cluster_plan(_cluster_inputs(corpus, false_negatives=flagged, clusters_per_batch=per_batch))
    assert false_negative_pairs(plan, flagged) == 0
    assert (_clusters_per_batch(plan, corpus.topic) <= per_batch + 1).mean() >= 0.9


def test_cluster_batches_mostly_keep_their_clusters_under_dense_flags(corpus):
    """Every row flagging its 3 nearest: a cluster's few batches cannot always take its pairs
    apart, and a row swapped with another cluster's adds a cluster to a batch; most batches
    keep at most one extra."""
    fn = corpus.false_negatives
    plan = _plan("clusters", corpus, seed=0, false_negatives=fn)
    assert false_negative_pairs(plan, fn) == 0
    assert (_clusters_per_batch(plan, corpus.topic) <= 5).mean() >= 0.85
    # Still far harder than random: same-cluster pairs are most in-batch pairs' share.
    assert _hardness("clusters", corpus, false_negatives=fn) > 4 * _hardness("random", corpus)


def test_cluster_plan_rejects_bad_inputs(corpus):
    with pytest.raises(ValueError, match="clusters_per_batch"):
        cluster_plan(_cluster_inputs(corpus, clusters_per_batch=0))
    with pytest.raises(ValueError, match="clusters must be"):
        cluster_plan(_cluster_inputs(corpus, clusters=corpus.topic.reshape(40, 50)))


@pytest.mark.parametrize("name", SAMPLERS)
def test_a_corpus_too_small_to_separate_keeps_its_plan_shape(name):
    """Tiny-corpus fallback: 10 rows in 2 batches, each flagging every other row. No plan can
    separate them; each sampler still covers every row once in balanced batches."""
    x, topic = _topics(n=10, topics=2, seed=3)
    c = SimpleNamespace(x=x, topic=topic, **vars(_inputs(x, 9, flagged=0)))
    everyone = np.array([[j for j in range(10) if j != i] for i in range(10)])
    inputs = SamplerInputs(c.neighbours, c.scores, everyone, batch_size=5, seed=1, version=1, clusters=topic)
    plan = {
        "random": lambda: random_plan(10, 5, 1, version=1, false_negatives=everyone),
        "knn": lambda: neighbourhood_plan(inputs),
        "rwr": lambda: random_walk_plan(inputs),
        "clusters": lambda: cluster_plan(inputs),
        "mixed": lambda: mixed_plan(inputs),
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
