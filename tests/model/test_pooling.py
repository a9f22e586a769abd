"""``model.pooler`` unset reads a model folder the way the folder says (a sentence-transformers
``1_Pooling`` config); set and different, it wins with one warning line."""

import json
import shutil

import numpy as np
import torch
from transformers import AutoModel

from pipeline.config.loading import load_config
from pipeline.model.encode import encode_texts
from pipeline.model.encoder import declared_pooler, folder_pooler, load_sentence_encoder, pooler_warning
from pipeline.model.folders import load_tokenizer

SENTENCES = ["a cat sat on the mat", "the dog ran", "a short one", "and a somewhat longer sentence here"]


def _sentence_transformers_folder(tiny_model_dir, tmp_path, mode: str):
    """The tiny BERT as a sentence-transformers folder would lay it out, pooling ``mode``."""
    folder = tmp_path / f"st-{mode}"
    shutil.copytree(tiny_model_dir, folder)
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(
        json.dumps(
            {
                "word_embedding_dimension": 32,
                "pooling_mode_cls_token": mode == "cls",
                "pooling_mode_mean_tokens": mode == "mean",
                "pooling_mode_max_tokens": False,
            }
        )
    )
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    return folder


def _mean_pooled(folder, texts):
    """Mean over the non-padding tokens' last hidden states, computed here from AutoModel."""
    tokenizer, model = load_tokenizer(folder), AutoModel.from_pretrained(folder).eval()
    batch = tokenizer(texts, padding=True, truncation=True, max_length=32, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    pooled = (hidden * mask).sum(1) / mask.sum(1)
    return torch.nn.functional.normalize(pooled, dim=-1).numpy()


def test_an_unset_pooler_reads_a_sentence_transformers_folder_with_its_own_pooling(tiny_model_dir, tmp_path):
    folder = _sentence_transformers_folder(tiny_model_dir, tmp_path, "mean")
    assert load_config(None).model.pooler is None
    assert declared_pooler(folder) == folder_pooler(folder) == "mean"
    model = load_sentence_encoder(folder, pooler=load_config(None).model.pooler).eval()
    assert model.pooler == "mean"
    vectors = encode_texts(
        model, load_tokenizer(folder), SENTENCES, max_seq_len=32, batch_size=8, device=torch.device("cpu")
    )
    np.testing.assert_allclose(vectors, _mean_pooled(folder, SENTENCES), atol=1e-5)
    # The same folder declaring cls pooling is read with cls.
    assert (
        load_sentence_encoder(_sentence_transformers_folder(tiny_model_dir, tmp_path, "cls")).pooler == "cls"
    )


def test_a_pooler_set_against_the_folder_wins_with_one_warning_line(tiny_model_dir, tmp_path):
    folder = _sentence_transformers_folder(tiny_model_dir, tmp_path, "mean")
    warning = pooler_warning(folder, "cls")
    assert warning is not None and "\n" not in warning
    assert warning.startswith("[model] warning: model.pooler=cls, but ")
    assert "declares mean pooling" in warning and str(folder) in warning
    assert load_sentence_encoder(folder, pooler="cls").pooler == "cls"
    assert pooler_warning(folder, "mean") is None and pooler_warning(folder, None) is None


def test_a_plain_hugging_face_folder_declares_nothing_and_reads_as_cls(tiny_model_dir):
    assert declared_pooler(tiny_model_dir) is None and folder_pooler(tiny_model_dir) == "cls"
    assert pooler_warning(tiny_model_dir, "mean") is None  # nothing declared: nothing to contradict
