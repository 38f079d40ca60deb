"""Sentence embeddings under ONNX Runtime: `EmbeddingSession` over export_encoder's graph, and `TextTokenizer`,
which tokenizes as sentence-transformers does (its tokenizer's tokenizer.json, truncated to max_seq_length,
padded to the longest text of a batch, the prompt put before each text). onnxruntime, tokenizers, numpy:
no torch.

    sess = EmbeddingSession("embed.onnx")                     # reads embed.tokenizer.json beside it
    e = sess.encode(["a text", "another"])                    # (n e) float32, = SentenceTransformer.encode
    v = sess.encode("a text")                                 # (e): one string, one vector
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

import zoo

from .core import RuntimeSession
from .providers import SessionError

BATCH = 32  # sentence-transformers' default batch_size


class TextTokenizer:
    """A tokenizer.json read with the `tokenizers` library, set to truncate at max_length (None: no limit) and
    pad each batch to its longest text with pad_id."""

    def __init__(self, path: str | os.PathLike, max_length: int | None, pad_id: int, *, lower: bool = False) -> None:
        from tokenizers import Tokenizer

        self.path = Path(path)
        if not self.path.is_file():
            raise zoo.MissingFileError(f"{self.path}: no tokenizer.json there; the model's folder holds one")
        try:
            tok = Tokenizer.from_file(str(self.path))
        except Exception as e:  # noqa: BLE001 - the tokenizers library raises its own exception type
            raise SessionError(f"{self.path} cannot be read: {str(e).splitlines()[0][:200]}") from None
        tok.no_padding()
        tok.no_truncation()
        if max_length:
            tok.enable_truncation(max_length, strategy="longest_first")
        tok.enable_padding(pad_id=pad_id, pad_token=tok.id_to_token(pad_id) or "[PAD]")
        self.tok, self.lower = tok, lower

    def __call__(self, texts: list[str]) -> dict[str, np.ndarray]:
        """texts -> input_ids, attention_mask, token_type_ids (n t) int64."""
        if isinstance(texts, str) or not isinstance(texts, (list, tuple)) or not texts:
            raise zoo.InputError(f"texts must be a non-empty list of strings, got {type(texts).__name__}")
        if not all(isinstance(t, str) for t in texts):
            raise zoo.InputError("texts must all be strings")
        enc = self.tok.encode_batch([t.lower() if self.lower else t for t in texts])
        return {
            "input_ids": np.array([e.ids for e in enc], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in enc], dtype=np.int64),
            "token_type_ids": np.array([e.type_ids for e in enc], dtype=np.int64),
        }


def tokenizer_beside(onnx_path: Path) -> Path:
    """Where an export's tokenizer goes: MODEL.onnx -> MODEL.tokenizer.json."""
    return onnx_path.with_name(onnx_path.stem + ".tokenizer.json")


def with_prompt(texts: list[str], prompts: dict[str, str], default: str | None, prompt_name, prompt) -> list[str]:
    """texts with the prompt before each, as encode(prompt_name=..., prompt=...) puts it (prompt wins)."""
    if prompt is not None and not isinstance(prompt, str):
        raise zoo.InputError(f"prompt={prompt!r} must be a string")
    if prompt is None:
        name = default if prompt_name is None else prompt_name
        if name is not None and name not in prompts:
            known = ", ".join(sorted(prompts)) or "none"
            raise zoo.InputError(f"prompt_name={name!r} is not one of the model's prompts ({known})")
        prompt = prompts[name] if name is not None else ""
    return [prompt + t for t in texts] if prompt else list(texts)


class EmbeddingSession(RuntimeSession):
    """An ONNX Runtime session over an exported sentence encoder (attnzoo.kind "sentence_encoder")."""

    def __init__(self, path: str | os.PathLike, provider: str = "auto", *, tokenizer=None, **kw) -> None:
        super().__init__(path, provider, **kw)
        kind = self.metadata.get("attnzoo.kind")
        if kind != "sentence_encoder":
            raise SessionError(
                f"{self.path} is not a sentence encoder (attnzoo.kind={kind!r}); export one with "
                f"`attnzoo export --checkpoint FOLDER --whole -o {self.path.name}`"
            )
        meta = self.metadata
        self.max_seq_length = int(meta["attnzoo.max_seq_length"]) if meta.get("attnzoo.max_seq_length") else None
        self.prompts = json.loads(meta.get("attnzoo.prompts") or "{}")
        self.default_prompt_name = meta.get("attnzoo.default_prompt_name") or None
        self.dim = int(meta["attnzoo.dim"])
        self.token_types = json.loads(meta.get("attnzoo.token_types", "false"))
        tok = Path(tokenizer) if tokenizer is not None else tokenizer_beside(self.path)
        lower = json.loads(meta.get("attnzoo.do_lower_case", "false"))
        self.tokenizer = TextTokenizer(tok, self.max_seq_length, int(meta.get("attnzoo.pad_id", "0")), lower=lower)

    def encode(
        self, texts, *, prompt_name: str | None = None, prompt: str | None = None, batch_size: int = BATCH
    ) -> np.ndarray:
        """As SentenceTransformer.encode: a string -> its (e) embedding; a list (or tuple, or 1-D array) of
        strings -> (n e) float32, in batches of batch_size (each padded to its longest text); an empty list
        -> sentence-transformers' empty array, np.array([]). Anything else is refused naming it."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise zoo.InputError(f"batch_size={batch_size!r} must be a positive integer")
        one = isinstance(texts, str)
        batch = [texts] if one else _text_list(texts)
        if not batch:
            return np.array([])  # what sentence-transformers returns for []
        batch = with_prompt(batch, self.prompts, self.default_prompt_name, prompt_name, prompt)
        out = []
        for i in range(0, len(batch), batch_size):
            feeds = self.tokenizer(batch[i : i + batch_size])
            if not self.token_types:
                feeds.pop("token_type_ids")
            out.append(self.run_feeds(feeds)[0])
        got = np.concatenate(out).astype(np.float32, copy=False)
        return got[0] if one else got


def _text_list(texts) -> list[str]:
    """A batch of texts as a list, or an InputError naming what was given instead."""
    if isinstance(texts, np.ndarray) and texts.ndim == 1 and texts.dtype.kind in ("U", "O"):
        texts = texts.tolist()
    if not isinstance(texts, (list, tuple)):
        raise zoo.InputError(f"texts={_short(texts)} ({type(texts).__name__}): give a string or a list of strings")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise zoo.InputError(f"texts[{i}]={_short(t)} ({type(t).__name__}) is not a string; give strings only")
    return list(texts)


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


__all__ = ["BATCH", "EmbeddingSession", "TextTokenizer", "tokenizer_beside", "with_prompt"]
