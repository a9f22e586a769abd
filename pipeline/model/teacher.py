"""A teacher that scores (anchor, candidate) text pairs, for denoising mined negatives and
distilling into the student (issue 71): a bi-encoder's cosine of its own embeddings (a folder
our jobs export, or any sentence-transformers bi-encoder folder), or a cross-encoder's relevance
logit (a sentence-transformers ``CrossEncoder`` or Hugging Face sequence-classification folder
with one label). The teacher reads the texts with its own tokenizer, not the student's.

:class:`Teacher` is a Ray Data callable class too (``map_batches(Teacher, fn_constructor_kwargs=
...)``): an actor pool loads it once per actor and scores batches of pair rows where the pool's
resources put it, on a GPU where it is given one. In a refresh the miner's shards load it
(:func:`load_teacher`), each on its own device.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from pipeline.core.errors import ConfigError, first_line
from pipeline.data.tokenized import TokenizedCorpus, large_tokens
from pipeline.model.accel import autocast, native_bf16, to_device
from pipeline.model.encode import encode_batch_size, length_order

TEACHER_KINDS = ("bi_encoder", "cross_encoder")
CACHE_SHARE = 0.1
"""Of the memory available where a teacher loads, what it may keep of what it has computed
(:attr:`Teacher.cached`): it does not change during a run, so a text (bi-encoder) or a pair
(cross-encoder) read again is not computed again: an anchor in each denoising step, every row's
positive and the candidates that stay among its neighbours at every refresh. At 768 dimensions a
bi-encoder's text takes about 3 KiB; a cross-encoder's pair, its texts and about 200 bytes."""

PAIR_CHUNK = 65_536
"""Pairs a cross-encoder tokenizes in one call: its tokens as Python lists stay under about
100 MB, while a call still holds many forward passes' worth."""

PAIR_ENTRY_BYTES = 200
"""A cached pair's bytes beside its texts': the dict entry, the key's tuple and the score."""


@dataclass(frozen=True)
class TeacherSettings:
    """Which teacher, and how it reads."""

    model: str
    """A local model folder (the teacher fetches nothing: a hub name or cloud URI is the
    caller's to fetch first, as the jobs fetch ``model.name_or_path``)."""
    kind: str | None = None
    """``bi_encoder``: the cosine of its mean- or CLS-pooled embeddings (the folder's own
    pooling); ``cross_encoder``: the raw logit of a one-label sequence classifier (before any
    sigmoid: margins and softmaxes of logits are what MarginMSE and KL distil). None: read
    from the folder (:func:`folder_kind`)."""
    pooler: str | None = None
    """A bi-encoder's pooling, ``mean`` or ``cls``; None: the folder's own (as ``model.pooler``
    unset reads it: CLS for a plain Hugging Face folder)."""
    max_seq_len: int = 128
    """Tokens a text is cut to; a cross-encoder's pair, twice that (each text keeps what a
    bi-encoder would read of it: ``data.max_seq_len`` cuts a pair of two long texts no harder
    than the student reads them), or its tokenizer's limit where that is less (512 for BERT)."""
    batch_size: int | None = None
    """Pairs (cross-encoder) or texts (bi-encoder) a forward pass; None: as every encode on its
    device (:func:`~pipeline.model.encode.encode_batch_size`: 1,024 on a GPU, 64 on a CPU)."""


class Teacher:
    """A loaded teacher: :meth:`score` of pairs, or called on a Ray Data batch of
    ``anchor`` and ``candidate`` text columns, adding ``teacher_score``.

    Args:
        settings: the teacher.
        device: where it runs; None: the first CUDA device if there is one, else the CPU.
    """

    def __init__(self, settings: TeacherSettings, device: str | None = None):
        from transformers import AutoModelForSequenceClassification

        from pipeline.model.encoder import load_sentence_encoder
        from pipeline.model.folders import load_tokenizer

        folder = Path(settings.model)
        if settings.kind is None:
            settings = dataclasses.replace(settings, kind=folder_kind(folder))
        if settings.kind not in TEACHER_KINDS:
            raise ValueError(
                f"teacher kind must be one of {', '.join(TEACHER_KINDS)} (got {settings.kind!r})"
            )
        self.settings = settings
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.batch_size = settings.batch_size or encode_batch_size(self.device)
        self.tokenizer = load_tokenizer(folder)
        if settings.kind == "bi_encoder":
            self.model: Any = load_sentence_encoder(folder, pooler=settings.pooler)
        else:
            self.model = AutoModelForSequenceClassification.from_pretrained(folder)
            if self.model.config.num_labels != 1:
                raise ValueError(
                    f"teacher {folder}: a cross-encoder teacher has one label (got {self.model.config.num_labels})"
                )
            # Twice a text's tokens, but never past what the model reads (a tokenizer without a
            # limit of its own says so with a huge sentinel; its positions are the limit then).
            own_limit = self.tokenizer.model_max_length
            self.pair_max_len = min(
                2 * settings.max_seq_len,
                own_limit if own_limit < 1_000_000 else self.model.config.max_position_embeddings,
            )
        self.model.to(self.device).eval()
        # Unlike the student's mining (pipeline.model.accel.encodes_bf16), a bi-encoder teacher
        # encodes in bf16 wherever the device computes it natively: its scores are thresholds
        # and soft targets, not a ranking of near ties. The fine-tuned mpnet's cosines in bf16
        # were within 0.0026 (mean 0.0004) of fp32's on 31,500 Twitter URL pairs, no denoising
        # decision at margin 0.05 changed, and it encoded 1.9x faster on 2 AVX512-BF16 cores
        # (docs/results.md). A cross-encoder's logits, not measured so, follow encodes_bf16.
        self.bf16 = native_bf16(self.device) if settings.kind == "bi_encoder" else None
        self.cached: dict[Any, Any] = {}
        """What it has computed, up to :attr:`cache_bytes`: a bi-encoder's vectors by text, a
        cross-encoder's scores by ``(anchor, candidate)``."""
        self.cache_bytes = int(_available_bytes() * CACHE_SHARE)
        self._cached_bytes = 0
        self.texts_encoded = 0
        """Texts a bi-encoder has encoded so far (those its cache held are not counted)."""
        self.pairs_scored = 0
        """Pairs a cross-encoder has scored so far (those its cache held are not counted)."""

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        batch["teacher_score"] = self.score(list(batch["anchor"]), list(batch["candidate"]))
        return batch

    def score(self, anchors: list[str], candidates: list[str]) -> np.ndarray:
        """``(n,)`` float32: the teacher's score of each ``(anchors[i], candidates[i])``."""
        # An anchor stands beside each of its candidates: every distinct text is read once.
        texts, at = np.unique(np.array(anchors + candidates, dtype=object), return_inverse=True)
        return self.score_indexed(list(texts), at[: len(anchors)], at[len(anchors) :])

    def score_indexed(self, texts: list[str], left: np.ndarray, right: np.ndarray) -> np.ndarray:
        """``(n,)`` float32: the teacher's score of each pair ``(texts[left[i]], texts[right[i]])``
        (a bi-encoder encodes each of ``texts`` once, however many pairs it is in; a
        cross-encoder scores each distinct pair once)."""
        if self.settings.kind == "bi_encoder":
            vectors = self._vectors(texts)
            return np.einsum("ij,ij->i", vectors[left], vectors[right]).astype(np.float32)
        pairs = [(texts[i], texts[j]) for i, j in zip(left, right, strict=True)]
        missing = [pair for pair in dict.fromkeys(pairs) if pair not in self.cached]
        fresh: dict[tuple[str, str], np.float32] = {}
        if missing:
            anchors, candidates = zip(*missing, strict=True)
            fresh = dict(zip(missing, self._logits(list(anchors), list(candidates)), strict=True))
            self.pairs_scored += len(missing)
        self._keep(fresh, lambda pair, _: len(pair[0]) + len(pair[1]) + PAIR_ENTRY_BYTES)
        return np.array([fresh[p] if p in fresh else self.cached[p] for p in pairs], dtype=np.float32)

    def computed(self) -> tuple[int, str]:
        """:attr:`texts_encoded` of a bi-encoder (``"texts"``), :attr:`pairs_scored` of a
        cross-encoder (``"pairs"``): what it has computed, not what its cache answered."""
        if self.settings.kind == "bi_encoder":
            return self.texts_encoded, "texts"
        return self.pairs_scored, "pairs"

    def _vectors(self, texts: list[str]) -> np.ndarray:
        """``(len(texts), d)`` float32 unit vectors of ``texts``: those in the cache from it, the
        rest encoded here and kept while the cache has room."""
        from pipeline.model.encode import encode_texts

        missing = [text for text in dict.fromkeys(texts) if text not in self.cached]
        fresh: dict[str, np.ndarray] = {}
        if missing:
            encoded = encode_texts(
                self.model, self.tokenizer, missing, max_seq_len=self.settings.max_seq_len, batch_size=self.batch_size,
                device=self.device, bf16=self.bf16,
            )  # fmt: skip
            # Rows of their own, not views that would keep the whole batch alive in the cache.
            fresh = {text: vector.copy() for text, vector in zip(missing, encoded, strict=True)}
            self.texts_encoded += len(missing)
        # The dict entry's and the text's own bytes beside the vector's.
        self._keep(fresh, lambda text, vector: vector.nbytes + len(text) + 100)
        if not texts:
            return np.empty((0, 0), dtype=np.float32)
        return np.stack([fresh[text] if text in fresh else self.cached[text] for text in texts])

    def _keep(self, fresh: dict[Any, Any], size: Callable[[Any, Any], int]) -> None:
        """Keeps ``fresh``'s entries in :attr:`cached` in order while :attr:`cache_bytes` has
        room for their ``size(key, value)``."""
        for key, value in fresh.items():
            entry = size(key, value)
            if self._cached_bytes + entry > self.cache_bytes:
                break
            self.cached[key] = value
            self._cached_bytes += entry

    @torch.inference_mode()
    def _logits(self, anchors: list[str], candidates: list[str]) -> np.ndarray:
        """``(n,)`` float32: the cross-encoder's logit of each ``(anchors[i], candidates[i])``.

        Each chunk of :data:`PAIR_CHUNK` pairs is tokenized in one call, on a thread while the
        chunk before it runs (the tokenizer releases the GIL), and padded a batch at a time as
        every encode pads, in length order; the logits stay on the device to the chunk's end,
        so the host pads the next batch while the device computes. One tokenizer call a forward
        pass, padded by the tokenizer, took 2.4x the forward passes' time on an H200
        (docs/benchmarks.md, the fifth session on one H200)."""
        out = np.empty(len(anchors), dtype=np.float32)
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="teacher-tokens") as tokenizing:

            def tokenized(lo: int) -> Future:
                return tokenizing.submit(
                    self._pair_tokens, anchors[lo : lo + PAIR_CHUNK], candidates[lo : lo + PAIR_CHUNK]
                )

            ahead = tokenized(0)
            for lo in range(0, len(anchors), PAIR_CHUNK):
                tokens, token_types = ahead.result()
                if lo + PAIR_CHUNK < len(anchors):
                    ahead = tokenized(lo + PAIR_CHUNK)  # one chunk ahead, no more: its tokens wait in memory
                out[lo : lo + len(tokens)] = self._chunk_logits(tokens, token_types)
        return out

    def _chunk_logits(self, tokens: TokenizedCorpus, token_types: TokenizedCorpus | None) -> np.ndarray:
        """``(len(tokens),)`` float32: the logit of each tokenized pair, batched in length order."""
        batches = np.array_split(length_order(tokens.lengths), -(-len(tokens) // self.batch_size))
        logits = []
        for at in batches:
            input_ids, mask = tokens.batch(at)
            inputs = {"input_ids": input_ids, "attention_mask": mask}
            if token_types is not None:
                inputs["token_type_ids"] = token_types.batch(at)[0]
            with autocast(self.device, self.bf16):
                on_device = {name: to_device(array, self.device) for name, array in inputs.items()}
                logits.append(self.model(**on_device).logits[:, 0].float())
        out = np.empty(len(tokens), dtype=np.float32)
        out[np.concatenate(batches)] = torch.cat(logits).cpu().numpy()
        return out

    def _pair_tokens(
        self, anchors: list[str], candidates: list[str]
    ) -> tuple[TokenizedCorpus, TokenizedCorpus | None]:
        """The pairs' tokens (``[CLS] anchor [SEP] candidate [SEP]``, cut to twice
        ``max_seq_len`` or the model's limit), and their token types where the tokenizer gives
        them; row ``i`` for pair ``i``."""
        encoded = self.tokenizer(anchors, candidates, truncation=True, max_length=self.pair_max_len)

        def corpus(rows: list[list[int]], pad_id: int) -> TokenizedCorpus:
            # The token lists as the corpus holds them (tokenize_table's Arrow lists).
            tokens = large_tokens(pa.array(rows, type=pa.list_(pa.int32())))
            return TokenizedCorpus.of_arrays(tokens.offsets.to_numpy(), tokens.values.to_numpy(), pad_id)

        types = encoded.get("token_type_ids")
        return (
            corpus(encoded["input_ids"], self.tokenizer.pad_token_id),
            corpus(types, 0) if types is not None else None,
        )


def folder_kind(folder: Path) -> str:
    """``cross_encoder`` for a sequence classifier's folder (its ``config.json`` names a
    ``...ForSequenceClassification`` architecture, as a sentence-transformers ``CrossEncoder``
    saves it), else ``bi_encoder``."""
    config = folder / "config.json"
    architectures = json.loads(config.read_text()).get("architectures") or [] if config.is_file() else []
    return (
        "cross_encoder"
        if any(a.endswith("ForSequenceClassification") for a in architectures)
        else "bi_encoder"
    )


def model_kind(name_or_path: str) -> str:
    """:func:`folder_kind` of a model folder here, or of a hub model (its ``config.json`` alone
    fetched: the teacher itself is fetched where it runs).

    Raises:
        ConfigError: a hub model whose ``config.json`` cannot be read (one line naming
            ``mining.teacher.temperature``, which makes the kind unneeded).
    """
    local = Path(name_or_path).expanduser()
    if local.is_dir():
        return folder_kind(local)
    from huggingface_hub import hf_hub_download

    try:
        config = Path(hf_hub_download(name_or_path, "config.json"))
    except Exception as exc:  # noqa: BLE001 - any failure to fetch is the one line below
        raise ConfigError(
            f"mining.teacher.temperature: unset, and whether {name_or_path!r} is a cross-encoder "
            f"(logits) or a bi-encoder (cosines) cannot be read from its config.json "
            f"({first_line(exc)}); set it"
        ) from None
    return folder_kind(config.parent)


def load_teacher(settings: TeacherSettings, *, blob: bytes | None, device: str) -> Teacher:
    """The teacher loaded on this node: from ``blob``, its folder as the driver packed it
    (:func:`~pipeline.model.folders.pack_dir`, a folder of the driver's node), else from
    ``settings.model`` read here: a folder of this node, or a hub name fetched here.

    Raises:
        ValueError: ``settings.model`` is neither a folder here nor a reachable hub model (one
            line naming the key).
    """
    from pipeline.model.folders import unpacked_dir

    if blob is not None:
        with unpacked_dir(blob) as folder:
            return Teacher(dataclasses.replace(settings, model=str(folder)), device=device)
    if Path(settings.model).expanduser().is_dir():
        return Teacher(settings, device=device)
    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(settings.model)
    except Exception as exc:  # noqa: BLE001 - any failure to fetch is the one line below
        raise ValueError(
            f"mining.teacher.model: {settings.model!r} is neither a model folder on this node nor a "
            f"reachable hub model ({first_line(exc)})"
        ) from None
    return Teacher(dataclasses.replace(settings, model=folder), device=device)


def _available_bytes() -> int:
    """The memory available on this machine now."""
    import psutil  # deferred: Ray's dependency, present wherever a teacher runs

    return int(psutil.virtual_memory().available)
