"""Small random encoder-decoders, one per row of peers.seq2seq_rows.SEQ2SEQ_FAMILIES (T5 in both of its
feed-forward kinds, Marian with one token table and with one per stack), saved with save_pretrained and a
word-level tokenizer.json; no download.

`checkpoint(name, root)` writes a case once per folder and returns (folder, the transformers model)."""

from __future__ import annotations

import functools
import warnings
from pathlib import Path

import torch

VOCAB = 64
_BART = dict(
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=48,
    decoder_ffn_dim=48,
    max_position_embeddings=64,
    init_std=0.5,  # so that greedy tokens differ between rows and steps (0.02 makes one token everywhere)
)
# Marian as the Helsinki-NLP checkpoints have it: pad is the last id and the decoder's start, swish, scaled
# embeddings; the unshared case keeps a decoder table of its own, of another size
_MARIAN = dict(_BART, scale_embedding=True, activation_function="swish", eos_token_id=1, forced_eos_token_id=1)
_T5 = dict(
    d_kv=8, d_ff=48, num_layers=2, num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=16
)


def _config(name: str):
    import transformers as tf

    common = dict(vocab_size=VOCAB, d_model=32)
    return {
        "t5": lambda: tf.T5Config(**common, **_T5, decoder_start_token_id=0),
        "t5-gated": lambda: tf.T5Config(
            **common,
            **_T5,
            feed_forward_proj="gated-gelu",
            tie_word_embeddings=False,
            decoder_start_token_id=0,
        ),
        # more decoder layers than encoder layers: transformers 5.25's generate fails on it (its cache has
        # num_layers entries); compare with generate(use_cache=False), the model's own loop (cached_generate_ok)
        "t5-deep-decoder": lambda: tf.T5Config(**common, **_T5, num_decoder_layers=3, decoder_start_token_id=0),
        "bart": lambda: tf.BartConfig(**common, **_BART),
        "mbart": lambda: tf.MBartConfig(**common, **_BART, scale_embedding=True),
        "marian": lambda: tf.MarianConfig(**common, **_MARIAN, pad_token_id=63, decoder_start_token_id=63),
        "marian-unshared": lambda: tf.MarianConfig(
            **common,
            **_MARIAN,
            share_encoder_decoder_embeddings=False,
            decoder_vocab_size=48,
            pad_token_id=47,
            decoder_start_token_id=47,
        ),
    }[name]()


CASES = ("t5", "t5-gated", "t5-deep-decoder", "bart", "mbart", "marian", "marian-unshared")


@functools.cache
def hf_model(name: str):
    """The transformers model of a case, with every weight moved off its initial value (norms, biases)."""
    import transformers as tf

    torch.manual_seed(sum(map(ord, name)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = tf.AutoModelForSeq2SeqLM.from_config(_config(name)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:  # Marian's sinusoidal positions are fixed (and not saved)
                p.add_(torch.randn_like(p) * 0.05)
        vary(model, seed=sum(map(ord, name)))
        if hasattr(model, "final_logits_bias"):
            model.final_logits_bias.normal_(std=0.1)  # std 1 outweighs the head: one token everywhere
    if model.config.model_type == "marian":  # as Helsinki-NLP's generation_config.json: pad is never made
        model.generation_config.bad_words_ids = [[model.config.pad_token_id]]
    return model


def vary(model, seed: int) -> None:
    """So that greedy tokens vary between steps (T5, BART, mBART: at least two in a row; Marian not yet): at its
    initial weights a decoder with tied embeddings makes one token everywhere (its norms near 1 carry the input
    token's own embedding to the head, which picks it again, and the cross-attention outweighs the input). The
    decoder's norm weights are drawn N(0, 1) (signs and sizes that no longer mirror the token) and its
    cross-attention output is scaled down to 0.3."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if "decoder" not in name:
            continue
        if "norm" in name.lower() and name.endswith("weight"):
            p.copy_(torch.randn(p.shape, generator=g))
        elif ("encoder_attn." in name or "EncDecAttention" in name) and name.endswith(("out_proj.weight", ".o.weight")):
            p.mul_(0.3)


def distinct_new_tokens(tokens, skip=()) -> tuple[int, int]:
    """(distinct ids among a batch's new tokens, the most distinct in one row), the ids in `skip` (eos, pad) aside."""
    rows = [{int(t) for t in row[1:]} - set(skip) for row in tokens]
    return len(set().union(*rows)), max(len(r) for r in rows)


def cached_generate_ok(model) -> bool:  # noqa: ANN001 - a transformers model
    """Whether transformers' generate with its cache runs this model: transformers 5.25 sizes a T5's
    DynamicCache from num_hidden_layers (T5Config maps it to num_layers, the encoder's), so with more decoder
    layers generate raises IndexError (docs/seq2seq.md has the repro)."""
    cfg = model.config
    return cfg.model_type not in ("t5", "mt5") or cfg.num_decoder_layers <= cfg.num_layers


def decoder_vocab(model) -> int:  # noqa: ANN001 - a transformers model
    """The decoder's vocabulary: Marian's decoder_vocab_size where it has one, else the shared VOCAB."""
    return getattr(model.config, "decoder_vocab_size", None) or VOCAB


def save_tokenizer(folder: Path) -> None:
    """A word-level tokenizer: <pad> 0, </s> 1, <unk> 2 (T5's ids), then w3 .. w63."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{f"w{i}": i for i in range(3, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(folder / "tokenizer.json"))


def checkpoint(name: str, root: Path) -> tuple[Path, object]:
    folder = root / name
    model = hf_model(name)
    if not (folder / "config.json").is_file():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.save_pretrained(folder)
        save_tokenizer(folder)
    return folder, model


def batch(seed: int = 0, b: int = 4, s: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids (b s) and attention_mask (b s), rows 1 and 3 padded on the right (pad id 0 or 1: masked)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (b, s), generator=g)
    mask = torch.ones(b, s, dtype=torch.long)
    mask[1, 4:] = 0
    mask[3, 2:] = 0
    return ids, mask
