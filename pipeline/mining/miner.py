"""The miner: re-encode the texts with the newest weights, mine, log.

One refresh reads top to bottom in :meth:`HardNegativeMiner.refresh`: encode
(:mod:`pipeline.model.encode`), then the task's mining (pairs:
:func:`pipeline.mining.pair_refresh.refresh_pairs`, the rows' negatives column; corpus:
:func:`pipeline.mining.planning.refresh_corpus`, the next order of rows), then the log
(:mod:`pipeline.mining.refresh_log`).

:class:`HardNegativeMiner` is plain Python so it can be tested without Ray; the driver runs
it as a Ray actor (:mod:`pipeline.mining.miner_actor`) with its own resources. Everything it
is configured with is one :class:`~pipeline.mining.miner_settings.MinerSettings`; what it
logs of each refresh goes through :class:`~pipeline.mining.refresh_log.RefreshLog`.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
import torch

from pipeline.core.seams import hold_once
from pipeline.data.tokenized import TokenizedCorpus
from pipeline.data.triplets import Triplets
from pipeline.mining.encoded_texts import EmbeddedTexts
from pipeline.mining.miner_settings import MinerSettings
from pipeline.mining.pair_refresh import refresh_pairs
from pipeline.mining.planning import refresh_corpus
from pipeline.mining.refresh_log import RefreshLog
from pipeline.mining.refresh_report import RefreshReport
from pipeline.mining.text_keys import dense_keys
from pipeline.model.accel import compute_device, mining_dtype
from pipeline.model.encode import encode_batch_size, encode_rows, encode_with_actor_pool
from pipeline.model.encoder import SentenceEncoder, load_sentence_encoder
from pipeline.model.folders import load_tokenizer, quiet_libraries, unpack_dir
from pipeline.tracking.metric_logger import MetricLogger

__all__ = ["HardNegativeMiner", "RefreshReport"]

PREVIOUS_UPLOADS_WAIT_S = 60.0
"""How long a refresh waits for the previous one's uploads before it starts without them."""


class HardNegativeMiner:
    """Encodes the corpus, finds each row's nearest neighbours and builds a batch plan."""

    def __init__(
        self, corpus_table: Any, model_blob: bytes, settings: MinerSettings, triplets: Triplets | None = None
    ):
        """
        Args:
            corpus_table: the tokenized corpus (``id``, ``input_ids``, ``text_key``), sorted by id
                (:meth:`~pipeline.data.tokenized.TokenizedBlocks.table`).
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
        self.device = compute_device(use_gpu=settings.use_gpu)
        self.model: SentenceEncoder = load_sentence_encoder(model_dir, pooler=settings.pooler).to(self.device)
        self.text_keys = dense_keys(corpus_table.column("text_key").to_numpy())
        self.previous: RefreshReport | None = None
        """The last refresh's result: the next refresh's churn is measured against it."""
        self.log: RefreshLog | None = None
        if settings.tracking_uri and settings.run_id:
            logger = MetricLogger(settings.tracking_uri, settings.run_id, relay=settings.tracking_relay)
            logger.set_tags({"simcse.mining_dtype": mining_dtype(self.device)})
            self.log = RefreshLog(logger)

    def wait_logged(self, timeout: float) -> bool:
        """:meth:`~pipeline.mining.refresh_log.RefreshLog.wait_logged`; True at once without a
        run to log to."""
        return self.log.wait_logged(timeout) if self.log is not None else True

    def encode(self, encoder_state: dict[str, torch.Tensor]) -> np.ndarray:
        """Normalised embeddings of the whole corpus under the given encoder weights."""
        s = self.settings
        if s.encode_actors == 0:
            self.model.encoder.load_state_dict(encoder_state)
            rows = np.arange(len(self.corpus))
            batch_size = encode_batch_size(self.device)
            return encode_rows(self.model, self.corpus, rows, batch_size, self.device)
        # Each encode actor reserves what the miner reserves: the same work on the same device.
        return encode_with_actor_pool(
            self.corpus_table, self.corpus.lengths, model_blob=self.model_blob, pooler=s.pooler,
            encoder_state=encoder_state, actors=s.encode_actors, num_cpus=s.num_cpus, num_gpus=s.num_gpus,
            label_selector=s.label_selector,
        )  # fmt: skip

    def ready(self) -> int:
        """This actor's process id; answering proves the actor was placed and loaded, and a
        different id than before proves Ray restarted it."""
        return os.getpid()

    def refresh(self, encoder_state: dict[str, torch.Tensor], version: int, step: int) -> RefreshReport:
        """One refresh, top to bottom: encode the texts with the newest weights, mine (pairs:
        each anchor's negatives as a column of the rows; corpus: the next order of rows), log.
        The report is tagged ``version``."""
        # The previous refresh's table row and histogram land first (they had an epoch to go
        # up), so a miner that dies in this refresh loses none of them.
        self.wait_logged(PREVIOUS_UPLOADS_WAIT_S)
        hold_once("miner_refresh", version)
        started = time.perf_counter()
        embeddings = self.encode(encoder_state)
        encode_seconds = time.perf_counter() - started
        if self.triplets is not None:
            texts = EmbeddedTexts(
                embeddings,
                self.triplets.candidate_pool(),
                self.settings.search,
                seed=self.settings.seed + version,
            )
            report = refresh_pairs(
                texts, triplets=self.triplets, keys=self.text_keys, settings=self.settings,
                version=version, previous=self.previous,
            )  # fmt: skip
        else:
            report = refresh_corpus(
                embeddings,
                keys=self.text_keys,
                settings=self.settings,
                version=version,
                previous=self.previous,
            )
        report.metrics.update(
            {
                "mining/encode_s": encode_seconds,
                "mining/total_s": time.perf_counter() - started,
                "mining/plan_version": float(version),
            }
        )
        report.miner_pid = os.getpid()
        self.previous = report
        if self.log is not None:
            self.log.refresh(report, step, pairs=self.triplets is not None)
        return report
