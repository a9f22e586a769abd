"""The miner: re-encode the corpus with the newest weights, search it, plan the next epoch.

:class:`HardNegativeMiner` is plain Python so it can be tested without Ray; the driver
runs it as a Ray actor with its own resources (``mining.num_cpus`` / ``mining.num_gpus``)
through :func:`start_miner_actor`.
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
from pipeline.data.pairs import Triplets
from pipeline.data.tokenized import TokenizedCorpus, row_lengths
from pipeline.errors import first_line
from pipeline.mining.encode_pool import encode_with_actor_pool
from pipeline.mining.index import IndexSpec, estimate_index_bytes, knn_search
from pipeline.mining.negatives import (
    NegativeFilters,
    mine_anchor_negatives,
    text_keys,
)
from pipeline.mining.plan_quality import (
    _first_valid_scores,
    false_negative_pairs,
    in_batch_pair_similarities,
    plan_churn,
    plan_from_neighbours,
    similarity_histogram_png,
)
from pipeline.model.encode import encode_rows
from pipeline.model.encoder import SentenceEncoder, load_sentence_encoder
from pipeline.model.folders import load_tokenizer, quiet_libraries, unpack_dir


@dataclass
class RefreshReport:
    plan: BatchPlan
    metrics: dict[str, float]


class HardNegativeMiner:
    """Encodes the corpus, finds each row's nearest neighbours and builds a batch plan."""

    def __init__(
        self,
        corpus_table: Any,
        model_blob: bytes,
        pooler: str,
        batch_size: int,
        top_k: int,
        encode_batch_size: int,
        seed: int,
        use_gpu: bool = False,
        tracking_uri: str | None = None,
        run_id: str | None = None,
        index_spec: IndexSpec | None = None,
        filters: NegativeFilters | None = None,
        encode_actors: int = 0,
        encode_num_cpus: float = 1.0,
        encode_num_gpus: float = 0.0,
        triplets: Triplets | None = None,
        length_group_batches: int = 0,
    ):
        quiet_libraries()
        self.model_blob = model_blob
        self.pooler = pooler
        self.encode_pool = (encode_actors, encode_num_cpus, encode_num_gpus)
        self.corpus_table = corpus_table
        model_dir = unpack_dir(model_blob)

        tokenizer = load_tokenizer(model_dir)
        self.corpus = TokenizedCorpus(corpus_table, tokenizer.pad_token_id)
        self.device = torch.device("cuda" if use_gpu and torch.cuda.is_available() else "cpu")
        self.model: SentenceEncoder = load_sentence_encoder(model_dir, pooler=pooler).to(self.device)
        self.batch_size = batch_size
        self.top_k = top_k
        self.encode_batch_size = encode_batch_size
        self.seed = seed
        self.use_gpu = use_gpu
        self.index_spec = index_spec or IndexSpec()
        self.filters = filters or NegativeFilters()
        (self.text_keys,) = text_keys(corpus_table.column("text").to_pylist())
        self.previous_plan: BatchPlan | None = None
        self.triplets = triplets
        self.length_group_batches = length_group_batches
        """Triplet mode: group the plan's random batches by length (0: don't)."""
        self.logger = None
        if tracking_uri and run_id:
            from pipeline.tracking.metric_logger import MetricLogger

            self.logger = MetricLogger(tracking_uri, run_id)

    def _log_histogram(self, mined: np.ndarray, random_pairs: np.ndarray, version: int) -> None:
        """Similarity histogram of the negatives the loss will see, next to random pairs.

        Uploaded from a background thread: a slow or restarting tracking server must not
        hold up the plan (MLflow's client retries for minutes), and a failed upload only warns.
        """
        if self.logger is None:
            return
        import tempfile
        import threading
        from pathlib import Path

        folder = Path(tempfile.mkdtemp(prefix="simcse-hist-"))
        path = folder / f"negative_similarity_v{version}.png"
        if self.triplets is None:
            labels = ("random batches", f"mined plan v{version}")
            xlabel = "cosine similarity of in-batch negatives"
        else:
            labels = ("random pairs", f"mined negatives v{version}")
            xlabel = "cosine similarity to the anchor"
        similarity_histogram_png({labels[0]: random_pairs, labels[1]: mined}, xlabel, str(path))
        logger = self.logger

        def upload() -> None:
            import shutil

            wait = 1.0
            try:
                for attempt in range(12):  # about ten minutes of retries
                    try:
                        logger.client.log_artifact(logger.run_id, str(path), "mining")
                        return
                    except Exception as exc:
                        if attempt == 11:
                            print(
                                f"[mining] warning: histogram v{version} not logged: {first_line(exc)}",
                                flush=True,
                            )
                        time.sleep(wait)
                        wait = min(wait * 2, 60.0)
            finally:
                shutil.rmtree(folder, ignore_errors=True)

        threading.Thread(target=upload, name=f"histogram-v{version}", daemon=True).start()

    def _refresh_triplets(
        self, embeddings: np.ndarray, version: int, step: int, t0: float, t_encode: float
    ) -> RefreshReport:
        """Triplet mode: mine each anchor's negatives among the distinct positives."""
        triplets = self.triplets
        assert triplets is not None
        pool = np.unique(triplets.positive)
        keys = self.text_keys
        t1 = time.perf_counter()
        mined = mine_anchor_negatives(
            embeddings[triplets.anchor], embeddings[triplets.positive], embeddings[pool],
            keys[triplets.anchor], keys[triplets.positive], keys[pool], self.filters, self.top_k,
            spec=self.index_spec, use_gpu=self.use_gpu, seed=self.seed + version,
        )  # fmt: skip
        knn, chosen, positive_scores = mined.knn, mined.selected, mined.positive_scores
        chosen.indices = np.where(
            chosen.indices >= 0, pool[np.maximum(chosen.indices, 0)], -1
        )  # to text positions
        plan = random_plan(
            len(triplets), self.batch_size, seed=self.seed + version, version=version,
            lengths=row_lengths(self.corpus, triplets), group_batches=self.length_group_batches,
        )  # fmt: skip
        plan.negatives = chosen.indices
        found = chosen.scores[chosen.indices >= 0]
        rng = np.random.default_rng(self.seed)
        a, b = rng.integers(len(embeddings), size=(2, min(20_000, len(embeddings) ** 2)))
        random_pairs = np.einsum("ij,ij->i", embeddings[a], embeddings[b])
        metrics = {
            "mining/encode_s": t_encode,
            "mining/index_s": knn.index_seconds,
            "mining/search_s": knn.search_seconds,
            "mining/plan_s": time.perf_counter() - t1 - knn.index_seconds - knn.search_seconds,
            "mining/total_s": time.perf_counter() - t0,
            "mining/corpus_size": float(len(pool)),
            "mining/candidates": float(chosen.candidates),
            "mining/kept": float(chosen.kept),
            **{f"mining/removed_{name}": float(count) for name, count in chosen.removed.items()},
            "mining/anchors_short": float(chosen.anchors_short),
            "mining/positive_similarity_mean": float(positive_scores.mean()),
            "mining/random_pair_similarity_mean": float(random_pairs.mean()),
            "mining/plan_version": float(version),
        }
        if len(found):
            metrics.update(
                {
                    "mining/negative_similarity_mean": float(found.mean()),
                    "mining/negative_similarity_p10": float(np.percentile(found, 10)),
                    "mining/negative_similarity_p50": float(np.percentile(found, 50)),
                    "mining/negative_similarity_p90": float(np.percentile(found, 90)),
                }
            )
        if self.previous_plan is not None and self.previous_plan.negatives is not None:
            metrics["mining/churn"] = float((self.previous_plan.negatives != plan.negatives).mean())
        self.previous_plan = plan
        if len(found):
            self._log_histogram(found, random_pairs, version)
        if self.logger is not None:
            self.logger.log(metrics, step)
            self.logger.flush()
        return RefreshReport(plan, metrics)

    def encode(self, encoder_state: dict[str, torch.Tensor]) -> np.ndarray:
        """Normalised embeddings of the whole corpus under the given encoder weights."""
        actors, num_cpus, num_gpus = self.encode_pool
        if actors == 0:
            self.model.encoder.load_state_dict(encoder_state)
            rows = np.arange(len(self.corpus))
            return encode_rows(self.model, self.corpus, rows, self.encode_batch_size, self.device)
        return encode_with_actor_pool(
            self.corpus_table, self.corpus.lengths, self.model_blob, self.pooler, encoder_state,
            self.encode_batch_size, actors, num_cpus, num_gpus,
        )  # fmt: skip

    def ready(self) -> int:
        """This actor's process id; answering proves the actor was placed and loaded, and a
        different id than before proves Ray restarted it."""
        return os.getpid()

    def refresh(self, encoder_state: dict[str, torch.Tensor], version: int, step: int) -> RefreshReport:
        """Mine with the given encoder weights and return the plan tagged ``version``."""
        t0 = time.perf_counter()
        embeddings = self.encode(encoder_state)
        if self.triplets is not None:
            return self._refresh_triplets(embeddings, version, step, t0, time.perf_counter() - t0)
        rows = np.arange(len(self.corpus))
        t_encode = time.perf_counter() - t0
        k = min(self.top_k + 1, len(rows))
        kind = self.index_spec.resolve(len(rows))
        estimate = estimate_index_bytes(len(rows), embeddings.shape[1], k, kind, self.index_spec)
        print(
            f"[mining] v{version}: {kind} index over {len(rows)} x {embeddings.shape[1]}, about {estimate / 2**20:.0f} MiB",
            flush=True,
        )
        knn = knn_search(embeddings, k, use_gpu=self.use_gpu, spec=self.index_spec, seed=self.seed + version)
        t1 = time.perf_counter()
        n = len(rows)
        plan, filtered, false_negatives = plan_from_neighbours(
            knn, self.text_keys, self.filters, self.batch_size, self.seed + version, version
        )
        t_plan = time.perf_counter() - t1
        top1 = _first_valid_scores(knn.scores, np.where(filtered.duplicate, -1, knn.indices))
        baseline = random_plan(n, self.batch_size, seed=self.seed + 10_000 + version)
        pair_sims = in_batch_pair_similarities(embeddings, plan, self.seed)
        random_sims = in_batch_pair_similarities(embeddings, baseline, self.seed)
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
            "mining/batch_similarity_mean": float(pair_sims.mean()),
            "mining/batch_similarity_p10": float(np.percentile(pair_sims, 10)),
            "mining/batch_similarity_p50": float(np.percentile(pair_sims, 50)),
            "mining/batch_similarity_p90": float(np.percentile(pair_sims, 90)),
            "mining/random_batch_similarity_mean": float(random_sims.mean()),
            "mining/false_negatives_flagged": float((false_negatives >= 0).sum()),
            "mining/false_negative_pairs_in_batches": float(false_negative_pairs(plan, false_negatives)),
            "mining/plan_version": float(version),
        }
        if self.previous_plan is not None:
            metrics["mining/churn"] = plan_churn(self.previous_plan, plan)
        self.previous_plan = plan
        self._log_histogram(pair_sims, random_sims, version)
        if self.logger is not None:
            self.logger.log(metrics, step)
            self.logger.flush()
        return RefreshReport(plan, metrics)


def start_miner_actor(
    num_cpus: float, num_gpus: float, name: str | None = None, max_restarts: int = 0, **kwargs: Any
) -> Any:
    """Start :class:`HardNegativeMiner` as a Ray actor with its own resources.

    Ray restarts a dead actor up to ``max_restarts`` times (re-running the constructor);
    calls in flight when it died fail rather than being retried, so the caller knows to
    submit the refresh again with newer weights.
    """
    import ray

    actor_cls = ray.remote(HardNegativeMiner)
    options: dict[str, Any] = {
        "num_cpus": num_cpus,
        "num_gpus": num_gpus,
        "max_restarts": max_restarts,
        "max_task_retries": 0,
    }
    if name:
        options["name"] = name
    return actor_cls.options(**options).remote(use_gpu=num_gpus > 0, **kwargs)
