"""Tiny random encoders of every whole-encoder family, saved by transformers, and sentence-transformers
folders saved by sentence-transformers' own classes (Transformer, Pooling, Normalize), with a WordPiece
tokenizer built here: nothing is downloaded."""

from __future__ import annotations

import os
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

WORDS = "the a cat dog sat on mat hello world is was big small red blue query passage".split()
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, "##s", "##ed"]
TEXTS = [
    "hello world",
    "the cat sat on the mat",
    "big red dog is small blue cat was on the mat the end of it all and more words here",
    "a",
]


def _common(vocab: int) -> dict:
    return dict(
        vocab_size=vocab,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
    )


def config(family: str, vocab: int = len(VOCAB)):
    """A small transformers config of `family` (pad id 0, the tokenizer's)."""
    import transformers as tf

    if family == "bert":
        return tf.BertConfig(**_common(vocab), type_vocab_size=2)
    if family == "roberta":
        return tf.RobertaConfig(**_common(vocab), pad_token_id=0)
    if family == "xlm-roberta":
        return tf.XLMRobertaConfig(**_common(vocab), pad_token_id=0)
    if family == "distilbert":
        return tf.DistilBertConfig(
            vocab_size=vocab, dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=64
        )
    if family == "modernbert":
        ids = dict(pad_token_id=0, bos_token_id=2, cls_token_id=2, eos_token_id=3, sep_token_id=3)
        return tf.ModernBertConfig(
            **dict(_common(vocab), num_hidden_layers=3, intermediate_size=48),
            local_attention=4,
            global_attn_every_n_layers=2,
            **ids,
        )
    raise KeyError(family)


FAMILIES = ("bert", "roberta", "xlm-roberta", "distilbert", "modernbert")


def tokenizer():
    """A lower-casing WordPiece tokenizer over VOCAB built with the `tokenizers` library ([CLS] text [SEP]),
    wrapped as transformers' PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    ids = {w: i for i, w in enumerate(VOCAB)}
    tok = Tokenizer(models.WordPiece(ids, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    special = dict(unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]", mask_token="[MASK]")
    return PreTrainedTokenizerFast(tokenizer_object=tok, **special)


def checkpoint(folder: Path, family: str, *, seed: int = 0):
    """A random `family` encoder saved in `folder` (with its tokenizer); returns the live model (eval)."""
    import transformers as tf

    torch.manual_seed(seed)
    cfg = config(family)
    cfg._attn_implementation = "eager"
    model = tf.AutoModel.from_config(cfg).eval()
    with torch.no_grad():  # norms away from their initial ones, so a misplaced norm shows
        for name, p in model.named_parameters():
            if "norm" in name.lower():
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(folder)
    tokenizer().save_pretrained(folder)
    return model


def sentence_folder(
    folder: Path,
    family: str,
    mode="mean",
    *,
    normalize: bool = True,
    max_seq_length: int | None = 12,
    prompts: dict[str, str] | None = None,
    seed: int = 0,
) -> Path:
    """A sentence-transformers model of a random `family` encoder saved in `folder` by its own classes."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    hf = folder.parent / f"{folder.name}-hf"
    checkpoint(hf, family, seed=seed)
    t = Transformer(str(hf), max_seq_length=max_seq_length)
    modules = [t, Pooling(t.get_embedding_dimension(), mode)] + ([Normalize()] if normalize else [])
    SentenceTransformer(modules=modules, device="cpu", prompts=prompts).save(str(folder))
    return folder


def reference(folder: Path, texts=TEXTS, **kw):
    """SentenceTransformer(folder).encode(texts) in fp32."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(folder), device="cpu").encode(list(texts), **kw)
