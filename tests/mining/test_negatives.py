"""Negative filters against an independent per-anchor computation."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import text_keys

from bench.embedded_texts import mine_hard_negatives
from pipeline.mining.hard_negatives import SearchSettings
from pipeline.mining.negatives import FILTERS, NegativeFilters, select_negatives
from pipeline.mining.text_keys import KnownPositives, duplicate_mask, normalize_text


def _reference(cands, scores, pos, dup, f: NegativeFilters, known=None):
    """Straight-line version: walk each anchor's list and apply the rules one by one, in
    sentence-transformers' order (score filters first, then skip ``range_min`` survivors)."""
    removed = {"duplicate": 0, "known_positive": 0, "rank_window": 0, "max_score": 0, "relative_margin": 0}
    out, short = [], 0
    for i in range(len(cands)):
        searched, survivors, kept = 0, 0, []
        for j in range(cands.shape[1]):
            c, s = cands[i, j], scores[i, j]
            if c < 0:
                continue
            if dup[i, j]:
                removed["duplicate"] += 1
                continue
            if known is not None and known[i, j]:
                removed["known_positive"] += 1
                continue
            r, searched = searched, searched + 1
            hi = cands.shape[1] if f.range_max is None else f.range_max
            if f.max_score is not None and s > f.max_score:
                removed["max_score"] += 1
            elif f.relative_margin is not None and s > pos[i] - abs(pos[i]) * f.relative_margin:
                removed["relative_margin"] += 1
            elif r >= hi:
                removed["rank_window"] += 1
            else:
                survivors += 1
                if survivors <= f.range_min:
                    removed["rank_window"] += 1
                else:
                    kept.append((c, s))
        out.append(kept)
        short += len(kept) < f.num_negatives
    return out, removed, short


def _arrays(seed=0, n=40, k=12, pool=200, low=0.1):
    rng = np.random.default_rng(seed)
    scores = -np.sort(-rng.uniform(low, 0.99, size=(n, k)), axis=1)
    cands = np.stack([rng.choice(pool, size=k, replace=False) for _ in range(n)])
    cands[rng.random((n, k)) < 0.05] = -1
    dup = (rng.random((n, k)) < 0.15) & (cands >= 0)
    pos = rng.uniform(0.5 if low > 0 else low, 1.0, size=n)
    return cands, scores, pos, dup


@pytest.mark.parametrize(
    "filters",
    [
        NegativeFilters(relative_margin=None, num_negatives=3),
        NegativeFilters(range_min=2, range_max=8, relative_margin=None, num_negatives=2),
        NegativeFilters(max_score=0.6, relative_margin=None, num_negatives=4),
        NegativeFilters(relative_margin=0.05, num_negatives=3),
        NegativeFilters(range_min=1, range_max=10, max_score=0.9, relative_margin=0.1, num_negatives=5),
    ],
)
@pytest.mark.parametrize("low", [0.1, -0.6], ids=["positive-scores", "negative-scores"])
@pytest.mark.parametrize("with_known", [False, True], ids=["own-positive", "known-positives"])
def test_filters_match_reference(filters, low, with_known):
    cands, scores, pos, dup = _arrays(low=low)
    known = None
    if with_known:
        known = (np.random.default_rng(1).random(cands.shape) < 0.1) & (cands >= 0)
    got = select_negatives(cands, scores, pos, duplicate=dup, filters=filters, known_positive=known)
    kept, removed, short = _reference(cands, scores, pos, dup, filters, known)
    per_row = got.per_row
    assert {name: int(per_row[f"removed_{name}"].sum()) for name in FILTERS} == removed
    assert per_row["kept"].tolist() == [len(k) for k in kept]
    assert per_row["candidates"].tolist() == (cands >= 0).sum(axis=1).tolist()
    assert (per_row["candidates"] == per_row["kept"] + sum(per_row[f"removed_{n}"] for n in FILTERS)).all()
    assert _anchors_short(got, filters) == short  # counts anchors, not negatives
    for i, anchor_kept in enumerate(kept):
        want = [c for c, _ in anchor_kept[: filters.num_negatives]]
        row = got.indices[i]
        assert row[row >= 0].tolist() == want
        assert (row[len(want) :] == -1).all() and np.isnan(got.scores[i, len(want) :]).all()


def test_range_min_counts_what_the_score_filters_left_as_sentence_transformers_does():
    # pos 0.84, margin 0.05: the bar is 0.798, so 0.9 and 0.8 go; range_min=1 then skips 0.7.
    cands, scores = np.array([[0, 1, 2, 3, 4]]), np.array([[0.9, 0.8, 0.7, 0.6, 0.5]])
    dup = np.zeros_like(cands, dtype=bool)
    filters = NegativeFilters(range_min=1, relative_margin=0.05, num_negatives=1)
    got = select_negatives(cands, scores, np.array([0.84]), duplicate=dup, filters=filters)
    assert got.indices.tolist() == [[3]]
    assert {name: got.per_row[f"removed_{name}"].tolist() for name in FILTERS} == {
        "duplicate": [0], "known_positive": [0], "max_score": [0], "relative_margin": [2], "rank_window": [1]
    }  # fmt: skip


def test_relative_margin_below_a_negative_positive_score():
    # pos -0.2: the bar is -0.2 - 0.2 x 0.05 = -0.21, below the positive; (1 - margin) x pos
    # would put it at -0.19 and keep -0.205, a candidate nearer than the positive allows.
    cands, scores = np.array([[0, 1]]), np.array([[-0.205, -0.3]])
    dup = np.zeros_like(cands, dtype=bool)
    filters = NegativeFilters(range_min=0, relative_margin=0.05, num_negatives=1)
    got = select_negatives(cands, scores, np.array([-0.2]), duplicate=dup, filters=filters)
    assert got.indices.tolist() == [[1]]


def test_random_sampling_draws_from_the_kept_set_uniformly():
    cands, scores, pos, dup = _arrays(seed=1, n=400, k=12)
    filters = NegativeFilters(
        range_min=0, range_max=10, relative_margin=None, num_negatives=2, sampling="random"
    )
    kept, _, short = _reference(cands, scores, pos, dup, filters)
    got = select_negatives(cands, scores, pos, duplicate=dup, filters=filters, seed=3)
    counts_by_rank = np.zeros(12)
    for i, anchor_kept in enumerate(kept):
        allowed = [c for c, _ in anchor_kept]
        chosen = got.indices[i][got.indices[i] >= 0].tolist()
        assert set(chosen) <= set(allowed) and len(chosen) == min(2, len(allowed))
        assert len(set(chosen)) == len(chosen)
        for c in chosen:
            counts_by_rank[allowed.index(c)] += 1
    assert _anchors_short(got, filters) == short
    # Not just the top ones: later ranks are drawn about as often as the first.
    assert counts_by_rank[5] > 0.5 * counts_by_rank[0]
    again = select_negatives(cands, scores, pos, duplicate=dup, filters=filters, seed=3)
    assert np.array_equal(got.indices, again.indices)


def _anchors_short(got, filters: NegativeFilters) -> int:
    """Anchors left with fewer than ``num_negatives`` negatives, as a run counts them."""
    return int(((got.indices >= 0).sum(axis=1) < filters.num_negatives).sum())


def test_duplicates_by_normalized_text():
    texts = ["A cat sat.", "a  CAT sat", "Dogs bark!", "Birds fly", "dogs bark"]
    keys_by_text: dict[str, int] = {}
    keys = np.array([keys_by_text.setdefault(normalize_text(t), len(keys_by_text)) for t in texts])
    assert keys[0] == keys[1] and keys[2] == keys[4] and len(set(keys.tolist())) == 3
    cands = np.array([[1, 2, 3, -1], [0, 4, 3, 2]])
    anchors, positives = np.array([0, 2]), np.array([3, 3])  # anchor 0's positive is text 3
    mask = duplicate_mask(cands, keys[anchors], keys[positives], keys)
    assert mask.tolist() == [[True, False, True, False], [False, True, True, True]]


def test_bad_sampling_is_rejected():
    cands, scores, pos, dup = _arrays()
    with pytest.raises(ValueError, match="sampling"):
        select_negatives(cands, scores, pos, duplicate=dup, filters=NegativeFilters(sampling="best"))


def test_config_defaults_are_the_filter_defaults():
    from pipeline.config.loading import load_config

    assert NegativeFilters.from_config(load_config(None)) == NegativeFilters()


def test_known_positives_mask_matches_a_set_lookup():
    rng = np.random.default_rng(3)
    anchor_keys = rng.integers(0, 30, size=50)
    candidate_keys = rng.integers(0, 400, size=120)
    cands = rng.integers(-1, 120, size=(50, 9))
    known_a = rng.integers(0, 30, size=300)
    known_p = rng.integers(0, 400, size=300)
    pairs = set(zip(known_a.tolist(), known_p.tolist(), strict=True))
    want = np.array(
        [
            [c >= 0 and (anchor_keys[i], candidate_keys[c]) in pairs for c in row]
            for i, row in enumerate(cands)
        ]
    )
    got = KnownPositives.of(known_a, known_p, 400).mask(cands, anchor_keys, candidate_keys)
    assert want.any() and (got == want).all()


def test_every_known_positive_of_an_anchor_is_excluded_not_only_its_own_rows():
    """A headline with two paraphrase rows: mining row 1, row 2's positive (the nearest
    candidate) is a known positive, never its negative; a tweet that is the positive of another
    headline only is a fair negative."""
    anchors = ["storm hits coast", "storm hits coast", "market falls"]
    positives = ["coast hit by storm", "a storm hit the coast", "markets fall today"]
    pool = ["coast hit by storm", "a storm hit the coast", "markets fall today", "storm warning issued"]
    anchor_keys, positive_keys, pool_keys = text_keys(anchors, positives, pool)
    e = np.eye(4, dtype=np.float32)
    # Pool vectors: near the storm anchor for 0, 1 and 3 (3 the least), 2 far away.
    pool_vectors = np.stack([e[0] + 0.30 * e[1], e[0] + 0.25 * e[1], e[2], e[0] + 0.6 * e[3]])
    pool_vectors /= np.linalg.norm(pool_vectors, axis=1, keepdims=True)
    anchor_vectors = np.stack([e[0], e[0], e[2]])
    positive_vectors = pool_vectors[[0, 1, 2]]
    filters = NegativeFilters(range_min=0, relative_margin=None, num_negatives=1)
    inputs = dict(
        anchor_vectors=anchor_vectors, positive_vectors=positive_vectors, pool_vectors=pool_vectors,
        anchor_keys=anchor_keys, positive_keys=positive_keys, pool_keys=pool_keys, filters=filters,
        search=SearchSettings(top_k=4), seed=0,
    )  # fmt: skip
    own_only = mine_hard_negatives(**inputs, exclude_known_positives=False)
    assert own_only.negatives[:2, 0].tolist() == [1, 0]  # the other paraphrase: a false negative
    known = mine_hard_negatives(**inputs)
    assert known.negatives[:2, 0].tolist() == [3, 3]
    assert sum(known.table.column("removed_known_positive").to_pylist()) == 2
    # The table says, per anchor, what each filter removed: the storm anchors lost the other
    # paraphrase to known_positive, the market anchor nothing.
    assert known.table.column("removed_known_positive").to_pylist() == [1, 1, 0]
    assert known.table.column("removed_duplicate").to_pylist() == [1, 1, 1]  # each one's own positive
    counts = ["kept", *(f"removed_{name}" for name in FILTERS)]
    assert all(sum(row[c] for c in counts) == row["candidates"] for row in known.table.to_pylist())
    assert np.allclose(known.scores[:2, 0], pool_vectors[3] @ e[0])
    assert known.negatives[2, 0] in (0, 1, 3)  # the storm tweets are fair negatives for "market falls"
