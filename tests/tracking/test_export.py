"""Export round trip: AutoModel and SentenceTransformer give the pipeline's embeddings."""

from __future__ import annotations

import numpy as np
import torch

from pipeline.model.encode import encode_texts
from pipeline.model.encoder import load_sentence_encoder
from pipeline.model.folders import load_tokenizer

SENTENCES = ["Zonouku pai nabrou.", "Truvikai voze noura and more words here.", "A.", "Pai pai pai pai."]


def _pipeline_embeddings(model_dir, texts):
    """The embeddings the pipeline evaluates: the raw pooled output."""
    model = load_sentence_encoder(model_dir)
    return encode_texts(
        model,
        load_tokenizer(model_dir),
        texts,
        max_seq_len=32,
        batch_size=3,
        device=torch.device("cpu"),
        normalize=False,
    )


def test_export_loads_in_transformers_and_sentence_transformers(trained_tiny_model_dir):
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel, AutoTokenizer

    folder = trained_tiny_model_dir
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


def test_model_folder_behind_a_link_packs_its_files(tmp_path, trained_tiny_model_dir, monkeypatch):
    """Recipes point model.name_or_path at a link to an installed model; Hugging Face cache
    snapshots are folders of links. Both must travel to workers as real files. What a worker
    unpacks is gone once it has loaded the model, and the loaded model still encodes."""
    from pipeline.model.folders import pack_dir, unpacked_dir

    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(temp))  # where the worker's node keeps temp files
    link = tmp_path / "linked-model"
    link.symlink_to(trained_tiny_model_dir, target_is_directory=True)
    with unpacked_dir(pack_dir(link)) as unpacked:
        assert unpacked.parent == temp
        assert (unpacked / "config.json").is_file() and not (unpacked / "config.json").is_symlink()
        assert (unpacked / "model.safetensors").read_bytes() == (
            trained_tiny_model_dir / "model.safetensors"
        ).read_bytes()
        loaded = load_sentence_encoder(unpacked), load_tokenizer(unpacked)
    assert list(temp.iterdir()) == []
    after = encode_texts(
        *loaded, SENTENCES, max_seq_len=32, batch_size=3, device=torch.device("cpu"), normalize=False
    )
    np.testing.assert_allclose(after, _pipeline_embeddings(trained_tiny_model_dir, SENTENCES), atol=1e-6)
