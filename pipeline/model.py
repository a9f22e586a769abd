"""Encoder, pooling, SimCSE's train-only MLP head, and the on-disk model folder.

A model folder is a Hugging Face folder (``config.json``, safetensors weights, tokenizer)
plus ``simcse_pooling.json`` and the sentence-transformers module files, so it loads with
``AutoModel``/``AutoTokenizer`` and with ``SentenceTransformer``.

Model folders travel between Ray processes as tar bytes in the object store
(:func:`pack_dir` / :func:`unpack_dir`), so a cluster needs no shared filesystem and a
hub model is downloaded once, by the driver.
"""

from __future__ import annotations

import io
import json
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from pipeline.accel import autocast, to_device

POOLING_FILE = "simcse_pooling.json"
POOLERS = ("cls", "cls_before_pooler", "mean")
_SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


class SentenceEncoder(nn.Module):
    """A Hugging Face encoder with SimCSE pooling.

    ``cls`` and ``cls_before_pooler`` take the first token's last hidden state; ``mean``
    averages the non-padding tokens. With ``use_mlp`` a dense+tanh head (SimCSE's MLP) is
    applied on top during training only: :meth:`forward` with ``train_head=False`` (used
    for evaluation, mining and export) never applies it.
    """

    def __init__(self, encoder: nn.Module, pooler: str, use_mlp: bool):
        super().__init__()
        if pooler not in POOLERS:
            raise ValueError(f"model.pooler must be one of {', '.join(POOLERS)} (got {pooler!r})")
        self.encoder = encoder
        self.pooler = pooler
        hidden = encoder.config.hidden_size
        self.mlp = nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh()) if use_mlp else None

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, train_head: bool = True
    ) -> torch.Tensor:
        """Embeddings of shape ``(batch, hidden)``."""
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        if self.pooler == "mean":
            weights = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)
        else:
            pooled = hidden[:, 0]
        if train_head and self.mlp is not None:
            pooled = self.mlp(pooled)
        return pooled


def quiet_libraries() -> None:
    """Silence per-process chatter (weight-loading reports, progress bars) in Ray workers."""
    import logging

    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    for name in ("ray.train", "ray.data"):
        logging.getLogger(name).setLevel(logging.WARNING)
    try:  # Train V2 logs every report at INFO through a logger named by its file path
        from ray.train.v2._internal.execution import context as train_context

        logging.getLogger(train_context.__file__).setLevel(logging.WARNING)
    except ImportError:
        pass


def load_encoder(model_dir: str | Path, dropout: float | None = None) -> nn.Module:
    """``AutoModel`` from a local folder, with dropout set and the HF pooler frozen.

    SimCSE pooling never uses the HF pooler layer. Trainable but unused, its parameters
    would get no gradient, which DDP treats as an error; removed, the saved model would
    lack them and every later load would warn about newly initialised weights. Frozen, it
    is skipped by DDP and saved unchanged.
    """
    from transformers import AutoConfig, AutoModel

    config = AutoConfig.from_pretrained(model_dir)
    if dropout is not None:
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "dropout", "attention_dropout"):
            if hasattr(config, name):
                setattr(config, name, dropout)
    encoder = AutoModel.from_pretrained(model_dir, config=config)
    if getattr(encoder, "pooler", None) is not None:
        encoder.pooler.requires_grad_(False)
    return encoder


def load_tokenizer(model_dir: str | Path) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(f"model.name_or_path: {model_dir} has no fast tokenizer (tokenizer.json)")
    return tokenizer


def build_tiny_model_dir(
    texts: list[str],
    out_dir: str | Path,
    *,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    intermediate_size: int,
    vocab_size: int,
    max_seq_len: int,
    dropout: float,
    seed: int,
) -> Path:
    """Train a WordPiece tokenizer on ``texts`` and save it with a randomly initialised BERT."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertConfig, BertModel, BertTokenizerFast

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    normalizer = normalizers.BertNormalizer(lowercase=True)
    pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    # The trainer gives each "##c" continuation token its id in hash-map order, different in
    # every process, and merges with equal counts are ordered by id: the same texts gave a
    # different vocabulary on every run (huggingface/tokenizers#1794). Listing every "##c"
    # up front, sorted, fixes their ids, so the vocabulary depends on the texts alone.
    continuations = sorted(
        {
            "##" + char
            for text in texts
            for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text))
            for char in word[1:]
        }
    )
    trained = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    trained.normalizer = normalizer
    trained.pre_tokenizer = pre_tokenizer
    trained.train_from_iterator(
        texts,
        trainers.WordPieceTrainer(
            vocab_size=vocab_size, special_tokens=_SPECIAL_TOKENS + continuations, show_progress=False
        ),
    )
    # Rebuilt from the vocabulary so only the real special tokens are special ("##c" are
    # ordinary vocabulary entries, as in BERT's own vocab).
    wordpiece = Tokenizer(models.WordPiece(trained.get_vocab(), unk_token="[UNK]"))
    wordpiece.normalizer = normalizer
    wordpiece.pre_tokenizer = pre_tokenizer
    wordpiece.decoder = decoders.WordPiece()
    wordpiece.add_special_tokens(_SPECIAL_TOKENS)
    cls_id, sep_id = wordpiece.token_to_id("[CLS]"), wordpiece.token_to_id("[SEP]")
    wordpiece.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    tokenizer = BertTokenizerFast(tokenizer_object=wordpiece, model_max_length=max_seq_len)
    tokenizer.save_pretrained(out)
    config = BertConfig(
        vocab_size=wordpiece.get_vocab_size(),
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max(64, max_seq_len + 2),
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
        pad_token_id=wordpiece.token_to_id("[PAD]"),
    )
    torch.manual_seed(seed)
    BertModel(config).save_pretrained(out)
    return out


def _looks_local(name_or_path: str) -> bool:
    """Whether ``model.name_or_path`` is meant as a local folder rather than a hub name.

    Hub ids are ``name`` or ``org/name``. A path spelled relative or absolute, with a
    backslash or more than one ``/``, or whose first part exists here (``runs/x`` where
    ``runs/`` does), is a folder the user meant: sending it to the hub would fail late and
    with a confusing message.
    """
    if name_or_path.startswith(("/", "./", "../", "~", ".\\", "..\\")) or name_or_path in (".", ".."):
        return True
    if "\\" in name_or_path or name_or_path.count("/") > 1:
        return True
    first = name_or_path.split("/", 1)[0]
    return "/" in name_or_path and Path(first).exists()


def check_model_path(name_or_path: str) -> None:
    """Fail fast, before Ray starts, when ``model.name_or_path`` names a local folder that is
    not a model folder. Hub names pass: only the hub loader can tell whether they exist.

    Raises:
        ConfigError: naming ``model.name_or_path``.
    """
    from pipeline.config import ConfigError

    local = Path(name_or_path).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise ConfigError(
                f"model.name_or_path: {name_or_path} is a folder without config.json, not a Hugging Face model folder"
            )
        return
    if local.exists():
        raise ConfigError(f"model.name_or_path: {name_or_path} is a file, not a model folder")
    if _looks_local(name_or_path):
        raise ConfigError(f"model.name_or_path: model folder {name_or_path} does not exist")


def fetch_pretrained_dir(name_or_path: str, out_dir: str | Path) -> Path:
    """A local folder for a model given as a folder or a hub name (downloaded once, here)."""
    local = Path(name_or_path).expanduser()  # as check_model_path reads it
    if local.is_dir():
        return local
    from transformers import AutoModel, AutoTokenizer

    out = Path(out_dir)
    try:
        AutoTokenizer.from_pretrained(name_or_path).save_pretrained(out)
        AutoModel.from_pretrained(name_or_path).save_pretrained(out)
    except OSError as exc:
        raise ValueError(
            f"model.name_or_path: {name_or_path!r} is neither a model folder nor a reachable hub model "
            f"({str(exc).splitlines()[0]})"
        ) from None
    return out


def save_model_dir(model: SentenceEncoder, tokenizer: Any, out_dir: str | Path, max_seq_len: int) -> Path:
    """Write the inference model: HF encoder + tokenizer + pooling files.

    The training-only MLP head is not part of it (SimCSE evaluates without it).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    encoder = model.encoder
    encoder.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / POOLING_FILE).write_text(json.dumps({"pooler": model.pooler}, indent=2))
    _write_sentence_transformers_files(out, model.pooler, encoder.config.hidden_size, max_seq_len)
    return out


def _write_sentence_transformers_files(out: Path, pooler: str, hidden: int, max_seq_len: int) -> None:
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    (out / "modules.json").write_text(json.dumps(modules, indent=2))
    (out / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": max_seq_len, "do_lower_case": False})
    )
    pooling_dir = out / "1_Pooling"
    pooling_dir.mkdir(exist_ok=True)
    mode = "mean" if pooler == "mean" else "cls"
    (pooling_dir / "config.json").write_text(
        json.dumps(
            {"word_embedding_dimension": hidden, "pooling_mode": mode, "include_prompt": True}, indent=2
        )
    )


def load_sentence_encoder(
    model_dir: str | Path, pooler: str | None = None, use_mlp: bool = False, dropout: float | None = None
) -> SentenceEncoder:
    """A :class:`SentenceEncoder` from a model folder; the pooler defaults to the folder's own."""
    return SentenceEncoder(load_encoder(model_dir, dropout), pooler or folder_pooler(model_dir), use_mlp)


def folder_pooler(model_dir: str | Path) -> str:
    """The pooling a model folder declares: ours, else its sentence-transformers Pooling module
    (``mean`` or ``cls``), else ``cls`` (a plain Hugging Face folder, as SimCSE's own models)."""
    model_dir = Path(model_dir)
    ours = model_dir / POOLING_FILE
    if ours.exists():
        return json.loads(ours.read_text())["pooler"]
    st_pooling = model_dir / "1_Pooling" / "config.json"
    if st_pooling.exists():
        config = json.loads(st_pooling.read_text())
        mode = config.get("pooling_mode")
        if mode == "mean" or config.get("pooling_mode_mean_tokens"):
            return "mean"
        if mode == "cls" or config.get("pooling_mode_cls_token"):
            return "cls"
        raise ValueError(f"{st_pooling}: only mean or cls pooling is supported (got {config})")
    return "cls"


@torch.no_grad()
def encode_rows(
    model: SentenceEncoder,
    corpus: Any,
    rows: np.ndarray,
    batch_size: int,
    device: torch.device,
    normalize: bool = True,
) -> np.ndarray:
    """Float32 embeddings of corpus rows, in the order of ``rows``: L2-normalised, or the raw
    pooled output with ``normalize=False`` (what whitening is fitted on and export matches).

    Rows are encoded in order of length so batches carry little padding; eval mode, no
    gradient, bf16 autocast on CUDA.
    """
    was_training = model.training
    model.eval()
    order = np.argsort(corpus.lengths[rows], kind="stable")
    out = np.empty((len(rows), model.encoder.config.hidden_size), dtype=np.float32)
    for start in range(0, len(rows), batch_size):
        chunk = order[start : start + batch_size]
        input_ids, mask = corpus.batch(rows[chunk])
        with autocast(device):
            emb = model(to_device(input_ids, device), to_device(mask, device), train_head=False)
        emb = emb.float()
        out[chunk] = (torch.nn.functional.normalize(emb, dim=-1) if normalize else emb).cpu().numpy()
    model.train(was_training)
    return out


def encode_texts(
    model: SentenceEncoder,
    tokenizer: Any,
    texts: list[str],
    max_seq_len: int,
    batch_size: int,
    device: torch.device,
    normalize: bool = True,
) -> np.ndarray:
    """Embeddings of raw texts (tokenized here, then :func:`encode_rows`)."""
    import pyarrow as pa

    from pipeline.data import TokenizedCorpus, tokenize_table

    table = tokenize_table(pa.table({"text": texts}), tokenizer, max_seq_len)
    corpus = TokenizedCorpus(table, tokenizer.pad_token_id)
    return encode_rows(model, corpus, np.arange(len(texts)), batch_size, device, normalize)


def max_seq_len_of(model_dir: str | Path, default: int = 128) -> int:
    """The folder's own max length: sentence-transformers' setting, else the tokenizer's (capped)."""
    model_dir = Path(model_dir)
    st_config = model_dir / "sentence_bert_config.json"
    if st_config.exists():
        value = json.loads(st_config.read_text()).get("max_seq_length")
        if isinstance(value, int) and value > 0:
            return value
    tok_config = model_dir / "tokenizer_config.json"
    if tok_config.exists():
        value = json.loads(tok_config.read_text()).get("model_max_length")
        if isinstance(value, int) and 0 < value <= 8192:
            return value
    return default


def pack_dir(path: str | Path) -> bytes:
    buffer = io.BytesIO()
    # dereference: a model folder may be a link, or hold links (a Hugging Face cache snapshot)
    with tarfile.open(fileobj=buffer, mode="w", dereference=True) as tar:
        tar.add(str(Path(path).resolve()), arcname=".")
    return buffer.getvalue()


_UNPACKED: dict[int, Path] = {}


def unpack_dir(blob: bytes) -> Path:
    """Extract a :func:`pack_dir` archive into a private temp folder (once per process)."""
    key = hash(blob)
    if key not in _UNPACKED or not _UNPACKED[key].exists():
        target = Path(tempfile.mkdtemp(prefix="simcse-model-"))
        with tarfile.open(fileobj=io.BytesIO(blob), mode="r") as tar:
            tar.extractall(target, filter="data")
        _UNPACKED[key] = target
    return _UNPACKED[key]


def cpu_state_dict(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()}
