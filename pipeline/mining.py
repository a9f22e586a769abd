"""The miner: re-encode the corpus with the newest weights, search it, plan the next epoch.

:class:`HardNegativeMiner` is plain Python so it can be tested without Ray; the driver
runs it as a Ray actor with its own resources (``mining.num_cpus`` / ``mining.num_gpus``)
through :func:`start_miner_actor`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from pipeline.data import TokenizedCorpus
from pipeline.index import IndexSpec, estimate_index_bytes, knn_search
from pipeline.model import (
    SentenceEncoder,
    encode_rows,
    load_sentence_encoder,
    load_tokenizer,
    quiet_libraries,
    unpack_dir,
)
from pipeline.plans import BatchPlan, mean_in_batch_similarity, neighbourhood_plan, random_plan


@dataclass
class RefreshReport:
    plan: BatchPlan
    metrics: dict[str, float]


def exclude_self_and_same_text(indices: np.ndarray, row_ids: np.ndarray) -> tuple[np.ndarray, int]:
    """Mark with -1 each neighbour that is the row itself or has the same text (same id).

    Returns the cleaned copy and how many entries were removed.
    """
    cleaned = indices.copy()
    valid = cleaned >= 0
    same = np.zeros_like(valid)
    same[valid] = row_ids[cleaned[valid]] == np.broadcast_to(row_ids[:, None], cleaned.shape)[valid]
    same |= cleaned == np.arange(len(cleaned))[:, None]
    cleaned[same] = -1
    return cleaned, int(same.sum())


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
    ):
        quiet_libraries()
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
        self.logger = None
        if tracking_uri and run_id:
            from pipeline.tracking import MetricLogger

            self.logger = MetricLogger(tracking_uri, run_id)

    def ready(self) -> int:
        """Corpus size; answering proves the actor was placed and loaded."""
        return len(self.corpus)

    def refresh(self, encoder_state: dict[str, torch.Tensor], version: int, step: int) -> RefreshReport:
        """Mine with the given encoder weights and return the plan tagged ``version``."""
        t0 = time.perf_counter()
        self.model.encoder.load_state_dict(encoder_state)
        rows = np.arange(len(self.corpus))
        embeddings = encode_rows(self.model, self.corpus, rows, self.encode_batch_size, self.device)
        t_encode = time.perf_counter() - t0
        k = min(self.top_k + 1, len(rows))
        kind = self.index_spec.resolve(len(rows))
        estimate = estimate_index_bytes(len(rows), embeddings.shape[1], k, kind, self.index_spec)
        print(
            f"[mining] v{version}: {kind} index over {len(rows)} x {embeddings.shape[1]}, about {estimate / 2**20:.0f} MiB",
            flush=True,
        )
        knn = knn_search(embeddings, k, use_gpu=self.use_gpu, spec=self.index_spec, seed=self.seed + version)
        neighbours, removed = exclude_self_and_same_text(knn.indices, self.corpus.ids)
        t1 = time.perf_counter()
        plan = neighbourhood_plan(
            neighbours, knn.scores, self.batch_size, seed=self.seed + version, version=version
        )
        t_plan = time.perf_counter() - t1
        top1 = _first_valid_scores(knn.scores, neighbours)
        baseline = random_plan(len(rows), self.batch_size, seed=self.seed + 10_000 + version)
        metrics = {
            "mining_encode_s": t_encode,
            "mining_index_s": knn.index_seconds,
            "mining_search_s": knn.search_seconds,
            "mining_plan_s": t_plan,
            "mining_total_s": time.perf_counter() - t0,
            "mining_corpus_size": float(len(rows)),
            "mining_index_estimated_mib": estimate / 2**20,
            "mining_top1_similarity_mean": float(top1.mean()) if len(top1) else float("nan"),
            "mining_self_or_same_text_removed": float(removed),
            "mining_batch_similarity_mean": mean_in_batch_similarity(embeddings, plan),
            "mining_random_batch_similarity_mean": mean_in_batch_similarity(embeddings, baseline),
            "mining_plan_version": float(version),
        }
        if self.logger is not None:
            self.logger.log(metrics, step)
            self.logger.flush()
        return RefreshReport(plan, metrics)


def _first_valid_scores(scores: np.ndarray, cleaned: np.ndarray) -> np.ndarray:
    valid = cleaned >= 0
    has = valid.any(axis=1)
    first = valid.argmax(axis=1)
    return scores[np.arange(len(scores)), first][has]


def start_miner_actor(num_cpus: float, num_gpus: float, name: str | None = None, **kwargs: Any) -> Any:
    """Start :class:`HardNegativeMiner` as a Ray actor with its own resources."""
    import ray

    actor_cls = ray.remote(HardNegativeMiner)
    options: dict[str, Any] = {"num_cpus": num_cpus, "num_gpus": num_gpus}
    if name:
        options["name"] = name
    return actor_cls.options(**options).remote(use_gpu=num_gpus > 0, **kwargs)
