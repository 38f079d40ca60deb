"""An optional API key for a server: every route but GET /healthz asks for `Authorization: Bearer KEY`.

The replicas never hold the key itself, only its sha256 (so it is not among the actor's arguments Ray keeps);
a request's key is hashed and the two digests compared with hmac.compare_digest, in constant time."""

from __future__ import annotations

import hashlib
import hmac
import os

API_KEY_ENV = "ATTNZOO_API_KEY"


def key_digest(key: str | None) -> str | None:
    """The sha256 (hex) a server checks keys against; None (no key) when `key` is None or empty."""
    return hashlib.sha256(key.encode()).hexdigest() if key else None


def key_from(flag: str | None) -> str | None:
    """The API key: the --api-key flag's, else the ATTNZOO_API_KEY environment variable's, else None."""
    return flag or os.environ.get(API_KEY_ENV) or None


def authorized(headers, digest: str | None) -> bool:
    """Whether a request's headers carry the key (always, when the server has none)."""
    if digest is None:
        return True
    scheme, _, given = (headers.get("authorization") or "").partition(" ")
    if scheme.lower() != "bearer":
        given = ""
    return hmac.compare_digest(hashlib.sha256(given.strip().encode()).hexdigest(), digest)


def refusal(path: str):
    """The 401 for a request without the right key: OpenAI's error format under /v1, one line elsewhere."""
    from starlette.responses import PlainTextResponse, Response

    message = "a missing or wrong API key: send the header 'Authorization: Bearer KEY'"
    headers = {"www-authenticate": "Bearer"}
    if "/v1/" in path + "/":
        from .openai.protocol import OpenAIError

        body = OpenAIError(message, 401, code="invalid_api_key").body()
        return Response(body, 401, media_type="application/json", headers=headers)
    return PlainTextResponse(message, 401, headers=headers)


__all__ = ["API_KEY_ENV", "authorized", "key_digest", "key_from", "refusal"]
