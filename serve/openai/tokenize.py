"""POST /tokenize and /detokenize of a whole-model server, in vLLM's request and answer shapes
(vllm/entrypoints/openai/protocol.py: TokenizeCompletionRequest, TokenizeChatRequest, DetokenizeRequest):

    {"model": M, "prompt": "text", "add_special_tokens": false, "return_token_strs": false}
    {"model": M, "messages": [...], "add_generation_prompt": true}
        -> {"count": n, "max_model_len": N, "tokens": [...], "token_strs": null or [...]}
    {"model": M, "tokens": [...]} -> {"prompt": "text"}

A prompt's tokens are those /v1/completions runs (the text as given: no special tokens added unless
add_special_tokens is true; vLLM's default adds them), messages' those /v1/chat/completions runs (the chat
template, with the generation prompt unless add_generation_prompt is false): `count` is then the answer's
usage.prompt_tokens. max_model_len: the most positions one request may take (prompt + max_tokens). "model" is
optional, as in vLLM; a wrong one is a 404.
"""

from __future__ import annotations

import json

from runtime.chat import ChatTemplateError

from .protocol import OpenAIError

TOKENIZE, DETOKENIZE = "/tokenize", "/detokenize"


def _doc(body: bytes, name: str) -> dict:
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise OpenAIError("the body is not JSON") from None
    if not isinstance(doc, dict):
        raise OpenAIError("the body must be a JSON object")
    if doc.get("model") not in (None, name):
        raise OpenAIError(f"the model {doc['model']!r} does not exist; this server runs {name!r}", 404, "model",
                          "model_not_found")  # fmt: skip
    return doc


def _flag(doc: dict, key: str, default: bool) -> bool:
    value = doc.get(key, default)
    if not isinstance(value, bool):
        raise OpenAIError(f"{key} must be true or false, not {value!r}", param=key)
    return value


def tokenize(front, body: bytes) -> dict:
    """The /tokenize answer of OpenAIFront `front` (its codec and chat template) for a request body."""
    doc = _doc(body, front.name)
    if front.codec is None:
        raise OpenAIError("this server has no tokenizer (no tokenizer.json with its export)")
    if "messages" in doc:
        if front.template is None:
            raise OpenAIError(f"{front.name} has no chat template; tokenize a prompt", param="messages")
        messages = doc["messages"]
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise OpenAIError("messages must be a list of objects", param="messages")
        try:
            text = front.template.render(messages, add_generation_prompt=_flag(doc, "add_generation_prompt", True))
        except ChatTemplateError as e:
            raise OpenAIError(str(e), param="messages") from None
        ids = front.codec.encode(text)
    elif isinstance(doc.get("prompt"), str):
        special = _flag(doc, "add_special_tokens", False)
        tok = front.codec.tok
        ids = tok.encode(doc["prompt"], add_special_tokens=True).ids if special else front.codec.encode(doc["prompt"])
    else:
        raise OpenAIError("give a prompt (a string) or messages", param="prompt")
    strs = [front.codec.tok.id_to_token(i) for i in ids] if _flag(doc, "return_token_strs", False) else None
    longest = min(front.capacity + 1, front.max_positions)
    return {"count": len(ids), "max_model_len": longest, "tokens": ids, "token_strs": strs}


def detokenize(front, body: bytes) -> dict:
    """The /detokenize answer: the text of the token ids (special tokens left out, as the answers' text)."""
    doc = _doc(body, front.name)
    if front.codec is None:
        raise OpenAIError("this server has no tokenizer (no tokenizer.json with its export)")
    ids = doc.get("tokens")
    if not isinstance(ids, list) or not all(type(i) is int for i in ids):
        raise OpenAIError("tokens must be a list of token ids", param="tokens")
    bad = [i for i in ids if not 0 <= i < front.vocab]
    if bad:
        raise OpenAIError(f"token id {bad[0]} is outside the vocabulary of {front.vocab}", param="tokens")
    return {"prompt": front.codec.decode(ids)}


__all__ = ["DETOKENIZE", "TOKENIZE", "detokenize", "tokenize"]
