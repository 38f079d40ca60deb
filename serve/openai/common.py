"""What every /v1 module shares: the routes, OpenAI's error format, the number check of a field (no Ray, no torch)."""

from __future__ import annotations

import json

from zoo import AttnzooError

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
MODELS = "/v1/models"
EMBEDDINGS = "/v1/embeddings"  # a sentence encoder's server (serve/embeddings/protocol.py)


class OpenAIError(AttnzooError, ValueError):
    """A request answered with `status` and OpenAI's error body (type, param, code)."""

    def __init__(self, message: str, status: int = 400, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.param, self.code = status, param, code

    @property
    def kind(self) -> str:
        return {401: "authentication_error", 404: "not_found_error", 413: "invalid_request_error"}.get(
            self.status, "invalid_request_error" if self.status < 500 else "server_error"
        )

    def body(self) -> bytes:
        doc = {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}}
        return json.dumps(doc).encode()


def number(doc: dict, name: str, low: float, high: float | None = None, *, integer: bool = False):
    v = doc.get(name)
    if v is None:
        return None
    kinds = (int,) if integer else (int, float)
    if isinstance(v, bool) or not isinstance(v, kinds) or v < low or (high is not None and v > high):
        what = "an integer" if integer else "a number"
        span = f">= {low}" if high is None else f"in {low}..{high}"
        raise OpenAIError(f"{name}={v!r} must be {what} {span}", param=name)
    return v


__all__ = ["CHAT", "COMPLETIONS", "EMBEDDINGS", "MODELS", "OpenAIError", "number"]
