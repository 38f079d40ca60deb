"""Checkpoints for the generation benchmark: a byte-level tokenizer and the benchmark's own random LLaMA.

    byte_tokenizer(vocab_size)      tokenizers' byte-level BPE without merges: id = byte value for
                                    the 256 bytes, then <s> </s> <pad>, then unreachable fillers up to
                                    vocab_size; any text round-trips, one token per UTF-8 byte
    random_llama(folder, seed=0)    the issue's benchmark model (hidden 512, 8 layers, 8 heads, 2 kv
                                    heads, intermediate 1408, vocab 8000), saved with save_pretrained
                                    beside that tokenizer (onnxruntime-genai's builder needs one)

The shipped trained model (models/tiny-stdlib-llama, scripts/train_lm.py) uses the same tokenizer
with vocab_size 259. transformers and tokenizers are imported when called.
"""

from __future__ import annotations

import json
from pathlib import Path

from .jobs import BenchError

SPECIALS = ("<s>", "</s>", "<pad>")  # ids 256, 257, 258: BOS, EOS, PAD
BOS, EOS, PAD = 256, 257, 258
BENCH_SHAPE = dict(
    vocab_size=8000,
    hidden_size=512,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=2,
    intermediate_size=1408,
    max_position_embeddings=4096,
    rope_theta=10000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map, the one tokenizers' ByteLevel uses."""
    keep = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def byte_tokenizer(vocab_size: int = 259):
    """A `tokenizers.Tokenizer`: one token per byte (id = byte value), the three SPECIALS at 256..258,
    and unreachable `<extra_N>` fillers up to vocab_size."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    if vocab_size < 256 + len(SPECIALS):
        raise BenchError(f"vocab_size={vocab_size} is below the 256 bytes and {len(SPECIALS)} special tokens")
    vocab = {ch: b for b, ch in bytes_to_unicode().items()}
    vocab.update({s: 256 + i for i, s in enumerate(SPECIALS)})
    vocab.update({f"<extra_{i}>": i for i in range(256 + len(SPECIALS), vocab_size)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    return tok


def save_tokenizer(folder: Path, vocab_size: int, max_length: int) -> None:
    """tokenizer.json and a tokenizer_config.json that transformers' AutoTokenizer reads as it is."""
    byte_tokenizer(vocab_size).save(str(Path(folder) / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_length,
        "bos_token": SPECIALS[0],
        "eos_token": SPECIALS[1],
        "pad_token": SPECIALS[2],
    }
    (Path(folder) / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def random_llama(folder: str | Path, seed: int = 0, **shape) -> Path:
    """Write the benchmark's random LLaMA (BENCH_SHAPE, overridable) into folder; returns the folder."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    folder = Path(folder)
    config = LlamaConfig(bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD, **{**BENCH_SHAPE, **shape})
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(folder)
    GenerationConfig(bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD, do_sample=False).save_pretrained(folder)
    save_tokenizer(folder, config.vocab_size, config.max_position_embeddings)
    return folder


def prompt_ids(folder: str | Path, length: int, seed: int = 0) -> list[int]:
    """`length` prompt ids: real text (the source of a few standard-library modules, which the shipped
    model holds out) through the folder's tokenizer.json when it encodes that text without unknown
    tokens, else seeded random ids below the vocabulary size."""
    import inspect
    import random

    folder = Path(folder)
    tok_file = folder / "tokenizer.json"
    if tok_file.exists():
        import heapq
        import textwrap

        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(tok_file))
        text = inspect.getsource(textwrap) + inspect.getsource(heapq)
        ids = tok.encode(text, add_special_tokens=False).ids
        unk = tok.token_to_id("<unk>") if tok.token_to_id("<unk>") is not None else -1
        if len(ids) >= length and unk not in ids[:length]:
            return ids[:length]
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(length)]
