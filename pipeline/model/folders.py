"""Model folders: fetching a pretrained one, saving a trained one in the sentence-transformers
layout, and packing one to travel through Ray's object store.
"""

from __future__ import annotations

import importlib.util
import io
import json
import logging
import os
import shutil
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import transformers
from transformers import AutoModel, AutoTokenizer

from pipeline.core.errors import ConfigError
from pipeline.core.scratch import process_scratch
from pipeline.model.encoder import POOLING_FILE, SentenceEncoder

_TRAIN_CONTEXT_FILE = ("train", "v2", "_internal", "execution", "context.py")
"""Where, inside Ray's package folder, the module whose logger :func:`quiet_libraries` quiets lives."""


def quiet_libraries() -> None:
    """Silence per-process chatter (weight-loading reports, progress bars) in Ray workers."""

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    # MlflowClient.log_table downloads the table it appends to, with a progress bar per call:
    # one line of bars in the job's log at every refresh.
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    for name in ("ray.train", "ray.data"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # Train V2 logs every report at INFO through a logger named by its file's path
    # (``logging.getLogger(__file__)``), outside the ``ray.train`` hierarchy. The name is built
    # from Ray's package folder (found without importing anything) rather than by importing
    # that private module; the level holds whether or not the module is imported yet, since
    # getLogger hands it this same logger.
    ray_spec = importlib.util.find_spec("ray")
    if ray_spec is not None and ray_spec.submodule_search_locations:
        ray_dir = list(ray_spec.submodule_search_locations)[0]
        logging.getLogger(os.path.join(ray_dir, *_TRAIN_CONTEXT_FILE)).setLevel(logging.WARNING)


def load_tokenizer(model_dir: str | Path) -> Any:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(f"model.name_or_path: {model_dir} has no fast tokenizer (tokenizer.json)")
    return tokenizer


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


def check_model_path(name_or_path: str, key: str = "model.name_or_path") -> None:
    """Fail fast, before Ray starts, when ``key`` (``model.name_or_path``, or the teacher's
    ``mining.teacher.model``) names a local folder that is not a model folder. Hub names pass:
    only the hub loader can tell whether they exist.

    Raises:
        ConfigError: naming ``key``.
    """

    local = Path(name_or_path).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise ConfigError(
                f"{key}: {name_or_path} is a folder without config.json, not a Hugging Face model folder"
            )
        return
    if local.exists():
        raise ConfigError(f"{key}: {name_or_path} is a file, not a model folder")
    if _looks_local(name_or_path):
        raise ConfigError(f"{key}: model folder {name_or_path} does not exist")


def fetch_pretrained_dir(name_or_path: str, out_dir: str | Path) -> Path:
    """A local folder for a model given as a folder or a hub name (downloaded once, here)."""
    local = Path(name_or_path).expanduser()  # as check_model_path reads it
    if local.is_dir():
        return local

    out = Path(out_dir)
    try:
        AutoTokenizer.from_pretrained(name_or_path).save_pretrained(out)
        AutoModel.from_pretrained(name_or_path).save_pretrained(out)
    except OSError as exc:
        raise ValueError(
            f"model.name_or_path: {name_or_path!r} is neither a model folder nor a reachable hub model "
            f"({str(exc).splitlines()[0]})"
        ) from None
    _fetch_sentence_transformers_pooling(name_or_path, out)
    return out


def _fetch_sentence_transformers_pooling(name: str, out: Path) -> None:
    """Copy a hub model's ``1_Pooling/config.json`` beside its weights, where it has one, so an
    unset ``model.pooler`` reads the model as its card says (``encoder.declared_pooler``)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    try:
        pooling = hf_hub_download(name, "1_Pooling/config.json")
    except (EntryNotFoundError, OSError):  # a plain Hugging Face model declares no pooling
        return
    (out / "1_Pooling").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(pooling, out / "1_Pooling" / "config.json")


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


@contextmanager
def unpacked_dir(blob: bytes) -> Iterator[Path]:
    """A :func:`pack_dir` archive extracted into a private temp folder, removed when the block
    ends: load the model and tokenizer inside it (neither reads its files once loaded). Every
    train worker, miner shard and teacher of every job unpacks its model on its node; left
    behind, those copies filled the nodes' ``/tmp`` (a base-size model is 420 MB a process);
    a killed process's copy is removed by the next one (:func:`~pipeline.core.scratch.
    process_scratch`)."""
    with process_scratch("simcse-model-") as folder:
        with tarfile.open(fileobj=io.BytesIO(blob), mode="r") as tar:
            tar.extractall(folder, filter="data")
        yield folder
