"""The miner: re-encode the texts with the newest weights, mine, log.

One refresh reads top to bottom in :meth:`HardNegativeMiner.refresh`: encode
(:mod:`pipeline.model.encode`), then the task's mining (pairs:
:func:`pipeline.mining.pair_refresh.refresh_pairs`, the rows' negatives column; corpus:
:func:`pipeline.mining.planning.refresh_corpus`, the next order of rows), then the log
(:mod:`pipeline.mining.refresh_log`).

:class:`HardNegativeMiner` is plain Python over a local Ray, so a test runs it as it is; the
driver runs it as a Ray actor (:mod:`pipeline.mining.miner_actor`) with its own resources. Everything it
is configured with is one :class:`~pipeline.mining.miner_settings.MinerSettings`; what it
logs of each refresh goes through :class:`~pipeline.mining.refresh_log.RefreshLog`.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import numpy as np
import torch

from pipeline.core.seams import hold_once
from pipeline.data.text_blocks import DistinctTexts, block_columns
from pipeline.data.tokenized import TokenizedBlocks
from pipeline.data.triplets import Triplets
from pipeline.mining.miner_settings import MinerSettings
from pipeline.mining.miner_shards import MinerShards, shard_actor_options
from pipeline.mining.pair_refresh import refresh_pairs
from pipeline.mining.planning import refresh_corpus
from pipeline.mining.refresh_log import RefreshLog
from pipeline.mining.refresh_report import RefreshReport
from pipeline.mining.text_keys import dense_keys
from pipeline.model.accel import compute_device, mining_dtype
from pipeline.model.folders import quiet_libraries
from pipeline.tracking.metric_logger import MetricLogger
from pipeline.training.plan_source import write_mined

__all__ = ["HardNegativeMiner", "RefreshReport"]

PREVIOUS_UPLOADS_WAIT_S = 60.0
"""How long a refresh waits for the previous one's uploads before it starts without them."""


class HardNegativeMiner:
    """Encodes the corpus, finds each row's nearest neighbours and builds a batch plan.

    Its texts are encoded, indexed and searched by ``mining.shards`` shards
    (:class:`~pipeline.mining.miner_shards.MinerShards`: one runs in this process, more are
    actors of their own); this process mines. For the pairs task it holds the rows and each
    text's key; for the corpus task the shards hold the keys and each row's partition.

    Args:
        blocks: the tokenized corpus in the object store.
        model_blob: the packed initial model folder (:func:`pipeline.model.folders.pack_dir`),
            or its object ref (the shards fetch it).
        settings: everything else it is configured with.
        triplets: the pairs task's rows over the corpus' texts; None: the corpus task.
        texts: the distinct texts, which a teacher (``settings.teacher``) reads with its own
            tokenizer; None without one.
        teacher_blob: the teacher's packed folder (:func:`pipeline.model.folders.pack_dir`), or
            its object ref, where the driver packed a local one; None: ``settings.teacher.model``
            is read where the shards run (a folder of their node, or a hub name fetched there).
            The teacher scores where the shards encode (:meth:`MinerShards.score_indexed`).
    """

    def __init__(
        self,
        blocks: TokenizedBlocks,
        model_blob: Any,
        settings: MinerSettings,
        *,
        triplets: Triplets | None = None,
        texts: DistinctTexts | None = None,
        teacher_blob: Any = None,
    ):
        quiet_libraries()
        pool = triplets.candidate_pool() if triplets is not None else None
        teacher = settings.teacher if triplets is not None else None
        assert teacher is None or texts is not None, (
            "a teacher reads the texts: give the miner the DistinctTexts"
        )
        self.shards = MinerShards.start(
            blocks, model_blob, pooler=settings.pooler, candidates=pool, shards=settings.shards,
            search=settings.search, actor_options=shard_actor_options(settings), teacher=teacher,
            teacher_blob=teacher_blob,
        )  # fmt: skip
        self.settings = settings
        self.triplets = triplets
        self.text_keys = None
        if triplets is not None:  # the corpus task's keys stay in the shards (MinerShards.keys_of)
            keys, _ = block_columns(blocks.refs, ["text_key"], num_cpus=0)
            self.text_keys = dense_keys(keys.column("text_key").to_numpy())
        self.texts = texts
        # Each shard loaded the teacher where it encodes; the shards score the refresh's pairs.
        self.teacher = self.shards if teacher is not None else None
        # What the next refresh's churn is measured against, and nothing more of the last
        # report: its teacher scores and histograms are as long as the rows.
        self.previous_version: int | None = None
        self.previous_negatives: np.ndarray | None = None
        self.log: RefreshLog | None = None
        if settings.tracking_uri and settings.run_id:
            logger = MetricLogger(settings.tracking_uri, settings.run_id, relay=settings.tracking_relay)
            logger.set_tags({"simcse.mining_dtype": mining_dtype(compute_device(use_gpu=settings.use_gpu))})
            self.log = RefreshLog(logger)

    def wait_logged(self, timeout: float) -> bool:
        """:meth:`~pipeline.mining.refresh_log.RefreshLog.wait_logged`; True at once without a
        run to log to."""
        return self.log.wait_logged(timeout) if self.log is not None else True

    def ready(self) -> int:
        """This actor's process id; answering proves the actor was placed and loaded, and a
        different id than before proves Ray restarted it."""
        return os.getpid()

    def refresh(
        self, encoder_state: dict[str, torch.Tensor] | None, version: int, step: int
    ) -> RefreshReport:
        """One refresh, top to bottom: encode the texts with the newest weights (``encoder_state``;
        None: the model folder's, as the offline job mines), mine (pairs:
        each anchor's negatives as a column of the rows; corpus: the next order of rows), log.
        The report is tagged ``version``."""
        # The previous refresh's table row and histogram land first (they had an epoch to go
        # up), so a miner that dies in this refresh loses none of them.
        self.wait_logged(PREVIOUS_UPLOADS_WAIT_S)
        hold_once("miner_refresh", version)
        started = time.perf_counter()
        texts = self.shards
        encoded = texts.encode(encoder_state, seed=self.settings.seed + version)
        encode_seconds = max(shard["encode_seconds"] for shard in encoded)  # the slowest shard's
        if self.triplets is not None:
            report = refresh_pairs(
                texts, triplets=self.triplets, keys=self.text_keys, settings=self.settings,
                version=version, previous_negatives=self.previous_negatives, teacher=self.teacher,
                texts_at=self.texts.texts_at if self.texts is not None else None,
            )  # fmt: skip
        else:
            report = refresh_corpus(
                texts, settings=self.settings, version=version, previous_version=self.previous_version
            )
        report.metrics.update(
            {
                "mining/encode_s": encode_seconds,
                "mining/total_s": time.perf_counter() - started,
                "mining/plan_version": float(version),
            }
        )
        report.miner_pid = os.getpid()
        self.previous_version, self.previous_negatives = version, report.negatives
        if self.log is not None:
            self.log.refresh(report, step, pairs=self.triplets is not None)
        return self._handed_back(report)

    def _handed_back(self, report: RefreshReport) -> RefreshReport:
        """What goes back to training: with run storage (``settings.mined_dir``), the report with
        its negatives column written there and named by URI (the corpus plan was written there
        as it was planned), so that the rank that asked never receives every row; the
        histograms stay here."""
        folder = self.settings.mined_dir
        if folder is None or report.negatives is None:
            return report
        uri = write_mined(
            folder, f"v{report.version}-negatives.npz", negatives=report.negatives,
            teacher_scores=report.teacher_scores,
        )  # fmt: skip
        return dataclasses.replace(
            report, negatives=None, teacher_scores=None, mined=uri, similarities={}, teacher_histogram={}
        )
