"""bench.gpu_inputs: the sentences and the random-weights model the GPU machine's peer
comparisons use load on both sides, as one model."""

from __future__ import annotations

import numpy as np
import torch
from conftest import REPO

from bench.gpu_inputs import write_inputs


def test_inputs_load_as_one_model_in_ours_and_in_sentence_transformers(tmp_path):
    from sentence_transformers import SentenceTransformer

    from pipeline.model.encode import encode_texts
    from pipeline.model.encoder import load_sentence_encoder
    from pipeline.model.folders import load_tokenizer
    from pipeline.model.tiny import TINY_BERT

    # The tiny shape keeps this quick on a CPU; the bench's BERT-base is the same code path.
    text_file, model_dir = write_inputs(tmp_path, REPO / "jobs/configs/demo.yaml", rows=300, shape=TINY_BERT)
    lines = text_file.read_text(encoding="utf-8").splitlines()
    assert text_file == tmp_path / "wiki/wiki1m_for_simcse.first11914.txt"
    assert len(lines) == len(set(lines)) == 300 and all(line.strip() == line != "" for line in lines)

    texts = lines[:16]
    model = load_sentence_encoder(model_dir, pooler="mean")
    ours = encode_texts(
        model, load_tokenizer(model_dir), texts, max_seq_len=32, batch_size=8, device=torch.device("cpu")
    )
    peer = SentenceTransformer(str(model_dir), device="cpu")
    peer.max_seq_length = 32
    theirs = peer.encode(texts, normalize_embeddings=True)
    np.testing.assert_allclose(ours, theirs, atol=1e-4)
