"""k-means clusters of the refreshed embeddings: the ``clusters`` sampler's batches and
``debias: cluster``'s likely false negatives (ClusterNS)."""

from __future__ import annotations

import numpy as np


def kmeans_clusters(
    embeddings: np.ndarray, num_clusters: int, seed: int, use_gpu: bool = False, niter: int = 20
) -> np.ndarray:
    """Spherical k-means (FAISS) over L2-normalised embeddings: each row's nearest centroid.

    Spherical: centroids are renormalised after each step and rows assigned by inner
    product, i.e. cosine similarity, the similarity the rows were searched with. Centroids
    are seeded k-means++-style (AFK-MC2); FAISS trains on at most 256 rows per centroid (a
    seeded sample), then every row is assigned.

    Args:
        embeddings: ``(n, d)`` L2-normalised embeddings (any float dtype; FAISS gets float32).
        num_clusters: clusters to find, in [1, n].
        seed: seeds the centroid initialisation and the training sample.
        use_gpu: train and assign on the GPU(s); ignored when this FAISS build has none.
        niter: k-means iterations.

    Returns:
        ``(n,)`` int64 cluster of each row, in ``[0, num_clusters)``.

    Raises:
        ValueError: embeddings not a non-empty ``(n, d)`` array, or ``num_clusters`` outside
            [1, n] (k-means cannot place more centroids than rows).
    """
    import faiss  # deferred: an optional extra ([cpu] or [gpu]); preflight names what is missing

    x = np.ascontiguousarray(embeddings, dtype=np.float32)
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"embeddings must be a non-empty (n, d) array, got shape {x.shape}")
    n, d = x.shape
    if not 1 <= num_clusters <= n:
        raise ValueError(f"num_clusters must be in [1, {n}] (the rows to cluster), got {num_clusters}")
    if niter < 1:
        raise ValueError(f"niter must be >= 1, got {niter}")
    gpu = bool(use_gpu) and faiss.get_num_gpus() > 0
    kmeans = faiss.Kmeans(
        d, int(num_clusters), niter=niter, seed=seed, spherical=True, gpu=gpu, verbose=False
    )
    # FAISS warns below 39 rows per centroid; a small corpus with many clusters is a
    # legitimate request here (one cluster per batch of rows), so it only trains.
    kmeans.cp.min_points_per_centroid = 1
    # FAISS seeds with random rows by default, which often leaves a true cluster without a
    # centroid and two centroids in another, and Lloyd's steps do not undo it: on 10 tight,
    # separated blobs random seeding recovered them in 11 of 30 seeds, AFK-MC2 (Bachem et
    # al., NeurIPS 2016, an approximation of k-means++) in 30 of 30. Its cost is about one
    # extra iteration (k-means++ itself: about five) at 100k rows, 1,562 clusters, d = 384
    # on CPU. Older FAISS builds without it (1.15 has it) keep random seeding.
    afk_mc2 = getattr(faiss, "ClusteringInitMethod_AFK_MC2", None)
    if afk_mc2 is not None:
        kmeans.cp.init_method = afk_mc2
    kmeans.train(x)
    _, assignment = kmeans.index.search(x, 1)
    return assignment.reshape(-1).astype(np.int64)
