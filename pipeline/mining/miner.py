"""The miner: re-encode the corpus with the newest weights, search it, plan the next epoch.

:class:`HardNegativeMiner` is plain Python so it can be tested without Ray; the driver runs
it as a Ray actor (:mod:`pipeline.mining.miner_actor`) with its own resources. Everything it
is configured with is one :class:`~pipeline.mining.miner_settings.MinerSettings`; what it
logs of each refresh goes through :class:`~pipeline.mining.refresh_log.RefreshLog`.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from pipeline.batching.plan import BatchPlan
from pipeline.batching.samplers import random_plan
from pipeline.core.seams import hold_once
from pipeline.data.tokenized import TokenizedCorpus
from pipeline.data.triplets import Triplets
from pipeline.mining.hard_negatives import (
    mine_hard_negatives,
    mining_metrics,
    random_pair_similarities,
    similarity_percentiles,
)
from pipeline.mining.index import estimate_index_bytes, knn_search
from pipeline.mining.miner_settings import MinerSettings
from pipeline.mining.plan_quality import (
    _first_valid_scores,
    false_negative_pairs,
    in_batch_pair_similarities,
    plan_churn,
)
from pipeline.mining.planning import plan_from_neighbours
from pipeline.mining.random_negatives import random_pool_negatives
from pipeline.mining.refresh_log import RefreshLog
from pipeline.mining.text_keys import text_keys
from pipeline.model.encode import encode_rows, encode_with_actor_pool
from pipeline.model.encoder import SentenceEncoder, load_sentence_encoder
from pipeline.model.folders import load_tokenizer, quiet_libraries, unpack_dir
from pipeline.tracking.metric_logger import MetricLogger

PREVIOUS_UPLOADS_WAIT_S = 60.0
"""How long a refresh waits for the previous one's uploads before it starts without them."""


@dataclass
class RefreshReport:
    """What one mining hands back to training: the corpus task's next order of rows (``plan``)
    or the pairs task's new negatives column (``negatives``, one row per training row), and
    what the mining measured (``metrics``, already logged by the miner)."""

    version: int
    metrics: dict[str, float]
    plan: BatchPlan | None = None
    negatives: np.ndarray | None = None
    """``(rows, m)`` text positions of each training row's negatives, -1 where none."""


class HardNegativeMiner:
    """Encodes the corpus, finds each row's nearest neighbours and builds a batch plan."""

    def __init__(
        self, corpus_table: Any, model_blob: bytes, settings: MinerSettings, triplets: Triplets | None = None
    ):
        """
        Args:
            corpus_table: the tokenized corpus (``id``, ``text``, ``input_ids``).
            model_blob: the packed initial model folder (:func:`pipeline.model.folders.pack_dir`).
            settings: everything else it is configured with.
            triplets: the pairs task's rows over the corpus' texts; None: the corpus task.
        """
        quiet_libraries()
        self.settings = settings
        self.corpus_table = corpus_table
        self.model_blob = model_blob
        self.triplets = triplets
        model_dir = unpack_dir(model_blob)
        self.corpus = TokenizedCorpus(corpus_table, load_tokenizer(model_dir).pad_token_id)
        self.device = torch.device("cuda" if settings.use_gpu and torch.cuda.is_available() else "cpu")
        self.model: SentenceEncoder = load_sentence_encoder(model_dir, pooler=settings.pooler).to(self.device)
        (self.text_keys,) = text_keys(corpus_table.column("text").to_pylist())
        self.previous: RefreshReport | None = None
        """The last refresh's result: the next refresh's churn is measured against it."""
        self.log: RefreshLog | None = None
        if settings.tracking_uri and settings.run_id:
            self.log = RefreshLog(MetricLogger(settings.tracking_uri, settings.run_id))

    def wait_logged(self, timeout: float) -> bool:
        """:meth:`~pipeline.mining.refresh_log.RefreshLog.wait_logged`; True at once without a
        run to log to."""
        return self.log.wait_logged(timeout) if self.log is not None else True

    def _log_histogram(self, mined: np.ndarray, random_pairs: np.ndarray, version: int) -> None:
        if self.log is not None:  # before drawing: without a run there is nothing to draw for
            self.log.histogram(mined, random_pairs, version, pairs=self.triplets is not None)

    def _report(self, report: RefreshReport, step: int) -> RefreshReport:
        """Remember the result (the next refresh's churn is against it) and log the refresh."""
        self.previous = report
        if self.log is not None:
            self.log.refresh(report.version, report.metrics, step)
        return report

    def _refresh_pairs(self, embeddings: np.ndarray, version: int, step: int, t0: float) -> RefreshReport:
        """The pairs task: encode (done) -> search and filter (:func:`mine_hard_negatives`) ->
        attach each anchor's negatives to its row as the rows' negatives column -> log."""
        triplets, s, keys = self.triplets, self.settings, self.text_keys
        assert triplets is not None
        t_encode = time.perf_counter() - t0
        pool = triplets.candidate_pool()
        mined = mine_hard_negatives(
            anchor_vectors=embeddings[triplets.anchor],
            positive_vectors=embeddings[triplets.positive],
            pool_vectors=embeddings[pool],
            anchor_keys=keys[triplets.anchor],
            positive_keys=keys[triplets.positive],
            pool_keys=keys[pool],
            filters=s.filters,
            search=s.search,
            seed=s.seed + version,
        )
        negatives = np.where(
            mined.negatives() >= 0, pool[np.maximum(mined.negatives(), 0)], -1
        )  # text positions
        if s.random_negatives:
            drawn = random_pool_negatives(
                keys, triplets.anchor, triplets.positive, pool, s.random_negatives, s.seed + version
            )
            negatives = np.concatenate([negatives, drawn], axis=1)
        random_pairs = random_pair_similarities(embeddings[triplets.anchor], embeddings[pool], s.seed)
        metrics = {
            "mining/encode_s": t_encode,
            **mining_metrics(mined, random_pairs=random_pairs, pool_size=len(pool)),
            "mining/random_negatives": float(s.random_negatives * len(triplets)),
            "mining/plan_version": float(version),
            "mining/total_s": time.perf_counter() - t0,
        }
        if self.previous is not None and self.previous.negatives is not None:
            # The share of the rows' mined negatives this refresh replaced: near 0 says the
            # model barely moved and the refresh bought nothing.
            metrics["mining/churn"] = float((self.previous.negatives != negatives).mean())
        found = mined.scores()[mined.negatives() >= 0]
        if len(found):
            self._log_histogram(found, random_pairs, version)
        return self._report(RefreshReport(version, metrics, negatives=negatives), step)

    def encode(self, encoder_state: dict[str, torch.Tensor]) -> np.ndarray:
        """Normalised embeddings of the whole corpus under the given encoder weights."""
        s = self.settings
        if s.encode_actors == 0:
            self.model.encoder.load_state_dict(encoder_state)
            rows = np.arange(len(self.corpus))
            return encode_rows(self.model, self.corpus, rows, s.encode_batch_size, self.device)
        return encode_with_actor_pool(
            self.corpus_table, self.corpus.lengths, model_blob=self.model_blob, pooler=s.pooler,
            encoder_state=encoder_state, batch_size=s.encode_batch_size, actors=s.encode_actors,
            num_cpus=s.encode_num_cpus, num_gpus=s.encode_num_gpus,
        )  # fmt: skip

    def ready(self) -> int:
        """This actor's process id; answering proves the actor was placed and loaded, and a
        different id than before proves Ray restarted it."""
        return os.getpid()

    def refresh(self, encoder_state: dict[str, torch.Tensor], version: int, step: int) -> RefreshReport:
        """Mine with the given encoder weights and return the plan tagged ``version``."""
        # The previous refresh's table row and histogram land first (they had an epoch to go
        # up), so a miner that dies in this refresh loses none of them.
        self.wait_logged(PREVIOUS_UPLOADS_WAIT_S)
        hold_once("miner_refresh", version)
        t0 = time.perf_counter()
        embeddings = self.encode(encoder_state)
        if self.triplets is not None:
            return self._refresh_pairs(embeddings, version, step, t0)
        s = self.settings
        n = len(self.corpus)
        t_encode = time.perf_counter() - t0
        k = min(s.search.top_k + 1, n)
        kind = s.search.index.resolve(n)
        estimate = estimate_index_bytes(n, embeddings.shape[1], k, kind, s.search.index)
        print(
            f"[mining] v{version}: {kind} index over {n} x {embeddings.shape[1]}, about {estimate / 2**20:.0f} MiB",
            flush=True,
        )
        knn = knn_search(embeddings, k, use_gpu=s.use_gpu, spec=s.search.index, seed=s.seed + version)
        t1 = time.perf_counter()
        refreshed = plan_from_neighbours(
            knn, self.text_keys, s.filters, s.plan, s.batch_size, s.seed + version, version
        )
        plan, filtered, false_negatives = refreshed.plan, refreshed.filtered, refreshed.false_negatives
        t_plan = time.perf_counter() - t1
        top1 = _first_valid_scores(knn.scores, np.where(filtered.duplicate, -1, knn.indices))
        baseline = random_plan(n, s.batch_size, seed=s.seed + 10_000 + version)
        pair_sims = in_batch_pair_similarities(embeddings, plan, s.seed)
        random_sims = in_batch_pair_similarities(embeddings, baseline, s.seed)
        metrics = {
            "mining/encode_s": t_encode,
            "mining/index_s": knn.index_seconds,
            "mining/search_s": knn.search_seconds,
            "mining/plan_s": t_plan,
            "mining/total_s": time.perf_counter() - t0,
            "mining/corpus_size": float(n),
            "mining/index_estimated_mib": estimate / 2**20,
            "mining/top1_similarity_mean": float(top1.mean()) if len(top1) else float("nan"),
            "mining/candidates": float(filtered.candidates),
            "mining/kept": float(filtered.allowed.sum()),
            **{f"mining/removed_{name}": float(count) for name, count in filtered.removed.items()},
            **{f"mining/batch_similarity_{k}": v for k, v in similarity_percentiles(pair_sims).items()},
            "mining/random_batch_similarity_mean": float(random_sims.mean()),
            "mining/false_negatives_flagged": float((false_negatives >= 0).sum()),
            "mining/false_negative_pairs_in_batches": float(false_negative_pairs(plan, false_negatives)),
            "mining/plan_version": float(version),
        }
        if self.previous is not None and self.previous.plan is not None:
            metrics["mining/churn"] = plan_churn(self.previous.plan, plan)
        self._log_histogram(pair_sims, random_sims, version)
        return self._report(RefreshReport(version, metrics, plan=plan), step)
