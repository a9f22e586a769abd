"""The miner: re-encode the corpus with the newest weights, search it, plan the next epoch.

:class:`HardNegativeMiner` is plain Python so it can be tested without Ray; the driver
runs it as a Ray actor with its own resources (``mining.num_cpus`` / ``mining.num_gpus``)
through :func:`start_miner_actor`. Everything it is configured with is one
:class:`MinerSettings`, built from the run config by :meth:`MinerSettings.from_config`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from pipeline.batching.plan import BatchPlan
from pipeline.batching.samplers import random_plan
from pipeline.config.metric_catalogue import MINING_TABLE, mining_charts
from pipeline.core.errors import first_line
from pipeline.core.retry import call_with_retries
from pipeline.core.seams import hold_once
from pipeline.data.tokenized import TokenizedCorpus, row_lengths
from pipeline.data.triplets import Triplets
from pipeline.mining.anchor_mining import mine_anchors, random_pool_negatives, similarity_percentiles
from pipeline.mining.index import IndexSpec, estimate_index_bytes, knn_search
from pipeline.mining.negatives import NegativeFilters, passed_each_filter, text_keys
from pipeline.mining.plan_quality import (
    _first_valid_scores,
    debias_counts,
    false_negative_pairs,
    in_batch_pair_similarities,
    plan_churn,
    similarity_histogram_png,
)
from pipeline.mining.planning import PlanSettings, plan_from_neighbours
from pipeline.model.encode import encode_rows, encode_with_actor_pool
from pipeline.model.encoder import SentenceEncoder, load_sentence_encoder
from pipeline.model.folders import load_tokenizer, quiet_libraries, unpack_dir
from pipeline.tracking.metric_logger import MetricLogger

if TYPE_CHECKING:
    from pipeline.config.schema import Config

PREVIOUS_UPLOADS_WAIT_S = 60.0
"""How long a refresh waits for the previous one's uploads before it starts without them."""
UPLOAD_ATTEMPTS = 12
"""Histogram and refresh-table uploads: with waits doubling from 1 s up to 60 s, about ten
minutes of retries."""


@dataclass(frozen=True)
class MinerSettings:
    """Everything the miner is configured with besides its inputs (corpus, model, triplets)."""

    pooler: str
    """``model.pooler``."""
    batch_size: int
    """``train.batch_size``: the global batch the plan is cut into."""
    top_k: int
    """``mining.top_k``: neighbours searched per row."""
    encode_batch_size: int
    """``mining.encode_batch_size``."""
    seed: int
    """``run.seed``; each refresh searches and plans with ``seed + version``."""
    index_spec: IndexSpec = field(default_factory=IndexSpec)
    filters: NegativeFilters = field(default_factory=NegativeFilters)
    plan: PlanSettings = field(default_factory=PlanSettings)
    """Neighbourhood mode: the batch sampler and the debiasing hints shipped with the plan."""
    random_negatives: int = 0
    """Triplet mode: random pool rows added per anchor beside the mined negatives."""
    encode_actors: int = 0
    """``mining.encode_actors``: 0 encodes in the miner itself, N on a Ray Data pool."""
    encode_num_cpus: float = 1.0
    encode_num_gpus: float = 0.0
    group_batches: int = 0
    """``train.group_batches``: triplet mode groups its plan's random batches by length in
    groups of this many batches (0: don't)."""
    num_cpus: float = 1.0
    """The miner actor's own CPUs (``mining.num_cpus``)."""
    num_gpus: float = 0.0
    """The miner actor's own GPUs (``mining.num_gpus``); with one it encodes and searches there."""
    max_restarts: int = 0
    """Times Ray restarts a dead miner actor (``mining.max_restarts``)."""
    tracking_uri: str | None = None
    run_id: str | None = None
    """The MLflow run the miner logs its ``mining/`` metrics and histograms to; None: no logging."""

    @property
    def use_gpu(self) -> bool:
        return self.num_gpus > 0

    @classmethod
    def from_config(
        cls, cfg: Config, tracking_uri: str | None = None, run_id: str | None = None
    ) -> MinerSettings:
        """The settings of the run config ``cfg``, logging to MLflow run ``run_id`` at ``tracking_uri``."""
        mining = cfg.mining
        return cls(
            pooler=cfg.model.pooler,
            batch_size=cfg.train.batch_size,
            top_k=mining.top_k,
            encode_batch_size=mining.encode_batch_size,
            seed=cfg.run.seed,
            index_spec=IndexSpec.from_section(mining),
            filters=NegativeFilters.from_section(mining),
            plan=PlanSettings.from_mining(mining),
            random_negatives=mining.random_negatives,
            encode_actors=mining.encode_actors,
            encode_num_cpus=mining.encode_num_cpus,
            encode_num_gpus=mining.encode_num_gpus,
            group_batches=cfg.train.group_batches,
            num_cpus=mining.num_cpus,
            num_gpus=mining.num_gpus,
            max_restarts=mining.max_restarts,
            tracking_uri=tracking_uri,
            run_id=run_id,
        )


@dataclass
class RefreshReport:
    plan: BatchPlan
    metrics: dict[str, float]


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
            triplets: triplet mode's rows over the corpus' texts; None: neighbourhood mode.
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
        self.previous_plan: BatchPlan | None = None
        self.logger = None
        self._uploads: Any = None
        if settings.tracking_uri and settings.run_id:
            self.logger = MetricLogger(settings.tracking_uri, settings.run_id)

    def _upload(
        self, what: str, upload: Callable[[Any], None], cleanup: Callable[[], None] | None = None
    ) -> None:
        """Run ``upload(logger)`` off the refresh's path, one upload at a time in refresh order
        (the refresh table is appended to, so two appends must not interleave).

        A slow or restarting tracking server must not hold up the plan (MLflow's client retries
        for minutes), and a failed upload only warns.
        """
        logger = self.logger
        if logger is None:
            return
        if self._uploads is None:
            self._uploads = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mining-upload")

        def run() -> None:
            try:
                call_with_retries(
                    lambda: upload(logger),
                    retry_on=Exception,
                    attempts=UPLOAD_ATTEMPTS,
                    wait_s=1.0,
                    max_wait_s=60.0,
                )
            except Exception as exc:
                print(f"[mining] warning: {what} not logged: {first_line(exc)}", flush=True)
            finally:
                if cleanup is not None:
                    cleanup()

        self._uploads.submit(run)

    def wait_logged(self, timeout: float) -> bool:
        """Block until the metrics, histograms and table rows sent so far reached MLflow;
        False (and a warning) when ``timeout`` seconds passed first (one budget for both)."""
        if self.logger is None:
            return True
        deadline = time.monotonic() + timeout
        done = True
        if self._uploads is not None:
            try:
                self._uploads.submit(lambda: None).result(timeout=timeout)
            except TimeoutError:
                done = False
        done = self.logger.wait_sent(max(0.0, deadline - time.monotonic())) and done
        if not done:
            print(f"[mining] warning: uploads still under way after {timeout:g}s; going on", flush=True)
        return done

    def _log_histogram(self, mined: np.ndarray, random_pairs: np.ndarray, version: int) -> None:
        """Similarity histogram of the negatives the loss will see, next to random pairs."""
        if self.logger is None:
            return

        folder = Path(tempfile.mkdtemp(prefix="simcse-hist-"))
        path = folder / f"negative_similarity_v{version}.png"
        if self.triplets is None:
            labels = ("random batches", f"mined plan v{version}")
            xlabel = "cosine similarity of in-batch negatives"
        else:
            labels = ("random pairs", f"mined negatives v{version}")
            xlabel = "cosine similarity to the anchor"
        similarity_histogram_png({labels[0]: random_pairs, labels[1]: mined}, xlabel, str(path))
        self._upload(
            f"histogram v{version}",
            lambda logger: logger.client.log_artifact(logger.run_id, str(path), "mining"),
            cleanup=lambda: shutil.rmtree(folder, ignore_errors=True),
        )

    def _report(self, plan: BatchPlan, metrics: dict[str, float], step: int) -> RefreshReport:
        """Remember the plan (the next refresh's churn is against it), chart the few metrics that
        move and append every diagnostic as one row of the refresh table."""
        self.previous_plan = plan
        if self.logger is not None:
            self.logger.log(mining_charts(metrics), step)
            self.logger.flush()
            # step and plan version first: the columns a reviewer reads a row by
            row = {"step": [step], "plan_version": [float(plan.version)]}
            row.update({key.removeprefix("mining/"): [value] for key, value in metrics.items()})
            self._upload(
                f"refresh table row v{plan.version}",
                lambda logger: logger.client.log_table(logger.run_id, row, MINING_TABLE),
            )
        return RefreshReport(plan, metrics)

    def _refresh_triplets(
        self, embeddings: np.ndarray, version: int, step: int, t0: float, t_encode: float
    ) -> RefreshReport:
        """Triplet mode: mine each anchor's negatives among the candidate pool (``data.pool``,
        else the distinct positives), every known positive of the anchor excluded."""
        triplets, settings = self.triplets, self.settings
        assert triplets is not None
        pool = triplets.candidate_pool()
        mined = mine_anchors(
            embeddings, self.text_keys, triplets.anchor, triplets.positive, pool, settings.filters,
            settings.top_k, settings.index_spec, settings.use_gpu, settings.seed + version, settings.seed,
        )  # fmt: skip
        t_plan = time.perf_counter()
        chosen, knn = mined.selected, mined.knn
        plan = random_plan(
            len(triplets), settings.batch_size, seed=settings.seed + version, version=version,
            lengths=row_lengths(self.corpus, triplets), group_batches=settings.group_batches,
        )  # fmt: skip
        plan.negatives = np.where(
            chosen.indices >= 0, pool[np.maximum(chosen.indices, 0)], -1
        )  # text positions
        if settings.random_negatives:
            drawn = random_pool_negatives(
                self.text_keys, triplets.anchor, triplets.positive, pool, settings.random_negatives,
                settings.seed + version,
            )  # fmt: skip
            plan.negatives = np.concatenate([plan.negatives, drawn], axis=1)
        found = chosen.scores[chosen.indices >= 0]
        metrics = {
            "mining/encode_s": t_encode,
            "mining/index_s": knn.index_seconds,
            "mining/search_s": knn.search_seconds,
            "mining/plan_s": mined.filter_seconds + time.perf_counter() - t_plan,
            "mining/total_s": time.perf_counter() - t0,
            "mining/corpus_size": float(len(pool)),
            "mining/candidates": float(chosen.candidates),
            "mining/kept": float(chosen.kept),
            **{f"mining/removed_{name}": float(count) for name, count in chosen.removed.items()},
            **{f"mining/passed_{name}": float(count) for name, count in passed_each_filter(chosen).items()},
            "mining/selected": float((chosen.indices >= 0).sum()),
            "mining/random_negatives": float(settings.random_negatives * len(triplets)),
            "mining/anchors_short": float(chosen.anchors_short),
            "mining/positive_similarity_mean": float(mined.positive_scores.mean()),
            "mining/random_pair_similarity_mean": float(mined.random_pairs.mean()),
            "mining/plan_version": float(version),
            **{f"mining/negative_similarity_{k}": v for k, v in similarity_percentiles(found).items()},
        }
        if self.previous_plan is not None and self.previous_plan.negatives is not None:
            metrics["mining/churn"] = float((self.previous_plan.negatives != plan.negatives).mean())
        if len(found):
            self._log_histogram(found, mined.random_pairs, version)
        return self._report(plan, metrics, step)

    def encode(self, encoder_state: dict[str, torch.Tensor]) -> np.ndarray:
        """Normalised embeddings of the whole corpus under the given encoder weights."""
        s = self.settings
        if s.encode_actors == 0:
            self.model.encoder.load_state_dict(encoder_state)
            rows = np.arange(len(self.corpus))
            return encode_rows(self.model, self.corpus, rows, s.encode_batch_size, self.device)
        return encode_with_actor_pool(
            self.corpus_table, self.corpus.lengths, self.model_blob, s.pooler, encoder_state,
            s.encode_batch_size, s.encode_actors, s.encode_num_cpus, s.encode_num_gpus,
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
            return self._refresh_triplets(embeddings, version, step, t0, time.perf_counter() - t0)
        s = self.settings
        n = len(self.corpus)
        t_encode = time.perf_counter() - t0
        k = min(s.top_k + 1, n)
        kind = s.index_spec.resolve(n)
        estimate = estimate_index_bytes(n, embeddings.shape[1], k, kind, s.index_spec)
        print(
            f"[mining] v{version}: {kind} index over {n} x {embeddings.shape[1]}, about {estimate / 2**20:.0f} MiB",
            flush=True,
        )
        knn = knn_search(embeddings, k, use_gpu=s.use_gpu, spec=s.index_spec, seed=s.seed + version)
        t1 = time.perf_counter()
        refreshed = plan_from_neighbours(
            knn, embeddings, self.text_keys, s.filters, s.plan, s.batch_size, s.seed + version, version,
            use_gpu=s.use_gpu,
        )  # fmt: skip
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
            **debias_counts(plan, s.plan.debias),
        }
        if self.previous_plan is not None:
            metrics["mining/churn"] = plan_churn(self.previous_plan, plan)
        self._log_histogram(pair_sims, random_sims, version)
        return self._report(plan, metrics, step)


class HardNegativeMinerActor:
    """:class:`HardNegativeMiner` as a Ray actor whose constructor takes only plain values.

    The corpus, the model and the triplets are object refs the driver holds for the job's
    life; every call brings them (``inputs``: a list, so that Ray hands them over unresolved)
    and the first call after a start or a restart loads the miner from them. A constructor
    that took them as arguments would make a restart depend on Ray keeping its own copy of the
    arguments, which it warns about at creation as an error-level line (ray-project/ray#53727).
    """

    def __init__(self, settings: MinerSettings):
        self.settings = settings
        self.miner: HardNegativeMiner | None = None

    def _loaded(self, inputs: list[Any]) -> HardNegativeMiner:
        if self.miner is None:
            import ray

            corpus_table, model_blob, triplets = (ray.get(x) if x is not None else None for x in inputs)
            self.miner = HardNegativeMiner(corpus_table, model_blob, self.settings, triplets)
        return self.miner

    def ready(self, inputs: list[Any]) -> int:
        """This actor's process id, once the miner is loaded (see :meth:`HardNegativeMiner.ready`)."""
        return self._loaded(inputs).ready()

    def refresh(
        self, inputs: list[Any], encoder_state: dict[str, torch.Tensor], version: int, step: int
    ) -> RefreshReport:
        """:meth:`HardNegativeMiner.refresh`, loading the miner first if this process has not."""
        return self._loaded(inputs).refresh(encoder_state, version, step)

    def wait_logged(self, timeout: float) -> bool:
        """:meth:`HardNegativeMiner.wait_logged` (nothing to wait for before the first load)."""
        return self.miner.wait_logged(timeout) if self.miner is not None else True


def start_miner_actor(settings: MinerSettings) -> Any:
    """Start :class:`HardNegativeMinerActor` with the settings' own resources; its calls take
    the list of object refs :func:`pipeline.training.contract.miner_inputs` makes.

    Returns:
        The actor handle. Ray restarts a dead actor up to ``settings.max_restarts`` times;
        calls in flight when it died fail rather than being retried, so the caller knows to
        submit the refresh again with newer weights (the new process loads on that call).
    """
    import ray

    return (
        ray.remote(HardNegativeMinerActor)
        .options(
            num_cpus=settings.num_cpus,
            num_gpus=settings.num_gpus,
            max_restarts=settings.max_restarts,
            max_task_retries=0,
        )
        .remote(settings)
    )
