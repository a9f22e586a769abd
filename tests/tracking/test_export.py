"""Export round trip: AutoModel and SentenceTransformer give the pipeline's embeddings, with and
without a whitening layer."""

from __future__ import annotations

import shutil

import numpy as np
import torch

from pipeline.evaluation.whitening import fit_whitening, load_whitening, save_whitening
from pipeline.model.encode import encode_texts
from pipeline.model.encoder import load_sentence_encoder
from pipeline.model.folders import load_tokenizer

SENTENCES = ["Zonouku pai nabrou.", "Truvikai voze noura and more words here.", "A.", "Pai pai pai pai."]


def _pipeline_embeddings(model_dir, texts):
    """The embeddings the pipeline evaluates: raw pooled output, whitened when the folder says so."""
    model = load_sentence_encoder(model_dir)
    raw = encode_texts(model, load_tokenizer(model_dir), texts, 32, 3, torch.device("cpu"), normalize=False)
    whitening = load_whitening(model_dir)
    return whitening.apply(raw) if whitening is not None else raw


def test_export_loads_in_transformers_and_sentence_transformers(
    tmp_path, trained_tiny_model_dir, paraphrase_corpus
):
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel, AutoTokenizer

    folder = tmp_path / "model"
    shutil.copytree(trained_tiny_model_dir, folder)
    ours = _pipeline_embeddings(folder, SENTENCES)

    tokenizer, model = AutoTokenizer.from_pretrained(folder), AutoModel.from_pretrained(folder).eval()
    with torch.no_grad():
        batch = tokenizer(SENTENCES, padding=True, truncation=True, max_length=32, return_tensors="pt")
        hidden = model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).float()
        hf = ((hidden * mask).sum(1) / mask.sum(1)).numpy()
    assert np.abs(ours - hf).max() < 1e-5
    st = SentenceTransformer(str(folder), device="cpu").encode(SENTENCES, convert_to_numpy=True)
    assert np.abs(ours - st).max() < 1e-5

    # With whitening fitted on corpus embeddings and saved, both loaders apply it.
    texts, _ = paraphrase_corpus
    corpus_raw = _pipeline_embeddings(folder, texts[:400])
    save_whitening(fit_whitening(corpus_raw, dim=16), folder)
    whitened = _pipeline_embeddings(folder, SENTENCES)
    assert whitened.shape == (len(SENTENCES), 16)
    st_whitened = SentenceTransformer(str(folder), device="cpu").encode(SENTENCES, convert_to_numpy=True)
    assert np.abs(whitened - st_whitened).max() < 1e-5
    assert np.abs(whitened - load_whitening(folder).apply(hf)).max() < 1e-5


def test_model_folder_behind_a_link_packs_its_files(tmp_path, trained_tiny_model_dir):
    """Recipes point model.name_or_path at a link to an installed model; Hugging Face cache
    snapshots are folders of links. Both must travel to workers as real files."""
    from pipeline.model.folders import pack_dir, unpack_dir

    link = tmp_path / "linked-model"
    link.symlink_to(trained_tiny_model_dir, target_is_directory=True)
    unpacked = unpack_dir(pack_dir(link))
    assert (unpacked / "config.json").is_file() and not (unpacked / "config.json").is_symlink()
    assert (unpacked / "model.safetensors").read_bytes() == (
        trained_tiny_model_dir / "model.safetensors"
    ).read_bytes()
