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

import dataclasses
import os
import time
from typing import Any, Protocol

import numpy as np
import torch

from pipeline.core.seams import hold_once
from pipeline.data.text_blocks import block_columns
from pipeline.data.tokenized import TokenizedBlocks, TokenizedCorpus
from pipeline.data.triplets import Triplets
from pipeline.mining.encoded_texts import EmbeddedTexts, EncodedTexts
from pipeline.mining.miner_settings import MinerSettings
from pipeline.mining.miner_shards import MinerShards, shard_actor_options
from pipeline.mining.pair_refresh import refresh_pairs
from pipeline.mining.planning import refresh_corpus
from pipeline.mining.refresh_log import RefreshLog
from pipeline.mining.refresh_report import RefreshReport
from pipeline.mining.text_keys import dense_keys
from pipeline.model.accel import compute_device, mining_dtype
from pipeline.model.encode import encode_batch_size, encode_rows
from pipeline.model.encoder import SentenceEncoder, load_sentence_encoder
from pipeline.model.folders import load_tokenizer, quiet_libraries, unpack_dir
from pipeline.tracking.metric_logger import MetricLogger
from pipeline.training.plan_source import write_mined

__all__ = ["HardNegativeMiner", "RefreshReport"]

PREVIOUS_UPLOADS_WAIT_S = 60.0
"""How long a refresh waits for the previous one's uploads before it starts without them."""


class HardNegativeMiner:
    """Encodes the corpus, finds each row's nearest neighbours and builds a batch plan.

    Its texts are encoded in this process (:class:`LocalEncoder`), or over ``mining.shards``
    shard actors (:meth:`over_shards`); a refresh reads the same either way.
    """

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
        pool = triplets.candidate_pool() if triplets is not None else None
        encoder = LocalEncoder(corpus_table, model_blob, settings, pool)
        keys = dense_keys(corpus_table.column("text_key").to_numpy())
        self._start(settings, triplets, encoder, keys)

    @classmethod
    def over_shards(
        cls,
        blocks: TokenizedBlocks,
        model_blob: Any,
        settings: MinerSettings,
        triplets: Triplets | None = None,
    ) -> HardNegativeMiner:
        """The miner over ``settings.shards`` :class:`~pipeline.mining.miner_shard.MinerShard`
        actors, each taking its range of ``blocks``; this process holds each text's key and the
        rows, neither the tokens nor the model.

        Args:
            blocks: the tokenized corpus in the object store.
            model_blob: the packed model folder, or its object ref (the shards fetch it).
            settings, triplets: as for the constructor.
        """
        quiet_libraries()
        keys, _ = block_columns(blocks.refs, ["text_key"], num_cpus=0)
        pool = triplets.candidate_pool() if triplets is not None else None
        shards = MinerShards.start(
            blocks, model_blob, pooler=settings.pooler, candidates=pool, shards=settings.shards,
            search=settings.search, actor_options=shard_actor_options(settings),
        )  # fmt: skip
        miner = cls.__new__(cls)
        miner._start(settings, triplets, shards, dense_keys(keys.column("text_key").to_numpy()))
        return miner

    def _start(
        self, settings: MinerSettings, triplets: Triplets | None, encoder: TextEncoder, keys: np.ndarray
    ) -> None:
        self.settings = settings
        self.triplets = triplets
        self.encoder = encoder
        self.text_keys = keys
        self.previous: RefreshReport | None = None
        """The last refresh's result: the next refresh's churn is measured against it."""
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

    def refresh(self, encoder_state: dict[str, torch.Tensor], version: int, step: int) -> RefreshReport:
        """One refresh, top to bottom: encode the texts with the newest weights, mine (pairs:
        each anchor's negatives as a column of the rows; corpus: the next order of rows), log.
        The report is tagged ``version``."""
        # The previous refresh's table row and histogram land first (they had an epoch to go
        # up), so a miner that dies in this refresh loses none of them.
        self.wait_logged(PREVIOUS_UPLOADS_WAIT_S)
        hold_once("miner_refresh", version)
        started = time.perf_counter()
        texts, encode_seconds = self.encoder.encode_texts(encoder_state, seed=self.settings.seed + version)
        if self.triplets is not None:
            report = refresh_pairs(
                texts, triplets=self.triplets, keys=self.text_keys, settings=self.settings,
                version=version, previous=self.previous,
            )  # fmt: skip
        else:
            report = refresh_corpus(
                texts,
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
        return self._handed_back(report)

    def _handed_back(self, report: RefreshReport) -> RefreshReport:
        """What goes back to training: with run storage (``settings.mined_dir``), the report with
        its plan or negatives column written there and named by URI, so that the rank that
        asked never receives every row; the histogram stays here too."""
        folder = self.settings.mined_dir
        if folder is None:
            return report
        kind = "plan.npz" if report.plan is not None else "negatives.npy"
        uri = write_mined(folder, f"v{report.version}-{kind}", plan=report.plan, negatives=report.negatives)
        return dataclasses.replace(report, plan=None, negatives=None, mined=uri, similarities={})


class TextEncoder(Protocol):
    """What encodes the texts at a refresh: :class:`LocalEncoder`, or the miner's shards."""

    def encode_texts(self, encoder_state: dict[str, torch.Tensor], seed: int) -> tuple[EncodedTexts, float]:
        """The texts under ``encoder_state`` with their index built (``seed``: its IVF sample),
        and the seconds the encode took."""
        ...


class LocalEncoder:
    """The whole corpus and the model in this process (``mining.shards: 1``)."""

    def __init__(
        self, corpus_table: Any, model_blob: bytes, settings: MinerSettings, pool: np.ndarray | None
    ):
        model_dir = unpack_dir(model_blob)
        self.settings = settings
        self.corpus = TokenizedCorpus(corpus_table, load_tokenizer(model_dir).pad_token_id)
        self.device = compute_device(use_gpu=settings.use_gpu)
        self.model: SentenceEncoder = load_sentence_encoder(model_dir, pooler=settings.pooler).to(self.device)
        self.pool = pool
        """Positions searches may return; None: every text."""

    def encode(self, encoder_state: dict[str, torch.Tensor]) -> np.ndarray:
        """Normalised embeddings of the whole corpus under the given encoder weights."""
        self.model.encoder.load_state_dict(encoder_state)
        rows = np.arange(len(self.corpus))
        return encode_rows(self.model, self.corpus, rows, encode_batch_size(self.device), self.device)

    def encode_texts(self, encoder_state: dict[str, torch.Tensor], seed: int) -> tuple[EncodedTexts, float]:
        started = time.perf_counter()
        embeddings = self.encode(encoder_state)
        seconds = time.perf_counter() - started
        return EmbeddedTexts(embeddings, self.pool, self.settings.search, seed=seed), seconds
