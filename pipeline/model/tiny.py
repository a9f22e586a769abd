"""A tiny BERT with a WordPiece tokenizer trained on the corpus: what tests and the demo
train when no pretrained model is configured (nothing is downloaded).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import BertConfig, BertModel, BertTokenizerFast

_SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


@dataclass(frozen=True)
class BertShape:
    """The size of a randomly initialised BERT and of the WordPiece vocabulary trained for it."""

    hidden_size: int
    """Width of the embeddings, and so of the sentence vectors the index holds."""
    num_layers: int
    num_heads: int
    """Attention heads per layer; must divide ``hidden_size``."""
    intermediate_size: int
    """Width of each layer's feed-forward block."""
    vocab_size: int
    """Largest vocabulary trained on the corpus (fewer when the corpus is small)."""


TINY_BERT = BertShape(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128, vocab_size=2000)
"""What a run builds when ``model.name_or_path`` is unset: small enough that tests and the demo
train in seconds on a CPU. A run that needs a larger model names a model folder instead."""


def build_random_bert_dir(
    texts: list[str],
    out_dir: str | Path,
    *,
    max_seq_len: int,
    dropout: float,
    seed: int,
    shape: BertShape = TINY_BERT,
) -> Path:
    """Train a WordPiece tokenizer on ``texts`` and save it with a randomly initialised BERT
    of ``shape``."""
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
            vocab_size=shape.vocab_size, special_tokens=_SPECIAL_TOKENS + continuations, show_progress=False
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
        hidden_size=shape.hidden_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        intermediate_size=shape.intermediate_size,
        max_position_embeddings=max(64, max_seq_len + 2),
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
        pad_token_id=wordpiece.token_to_id("[PAD]"),
    )
    torch.manual_seed(seed)
    BertModel(config).save_pretrained(out)
    return out
