"""A client for `attnzoo serve`, standard library only: .npy or JSON bodies, one retry on a
connection error or a 5xx."""

from __future__ import annotations

import http.client
import io
import json
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

import numpy as np

from zoo import AttnzooError, InputTypeError

from .blocks.protocol import DECODE_FIELDS, FIELDS, JSON, NPY, NPZ

# -- the client --------------------------------------------------------------------------------


@dataclass
class Reply:
    """One HTTP answer: status, headers (lower-case), body, and the client-side seconds."""

    status: int
    headers: dict[str, str]
    body: bytes
    seconds: float

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def timing(self, key: str) -> float | None:
        v = self.headers.get(f"x-attnzoo-{key}")
        return float(v) if v is not None else None


class ClientError(AttnzooError, RuntimeError):
    """The server answered a request with an error status (the server's line is the message)."""

    def __init__(self, reply: Reply) -> None:
        super().__init__(f"HTTP {reply.status}: {reply.body.decode(errors='replace').strip()[:300]}")
        self.reply = reply


class ClientConnectionError(AttnzooError, ConnectionError, RuntimeError):
    """No answer from the server after the client's retries (refused, reset, timed out); the message
    names the request, the address and the last failure. `except ConnectionError` catches it too."""


class ClientOptionError(AttnzooError, ValueError):
    """A Client asked for with a URL or an option it cannot use."""


def parse_url(url: str) -> tuple[str, int, str]:
    """(host, port, path prefix) of an http URL such as http://127.0.0.1:8000/; ClientOptionError
    (one line naming the URL) for anything else: another scheme, no host, a port out of 1..65535."""
    fix = "give an http URL such as http://127.0.0.1:8000/"
    if not isinstance(url, str):
        raise ClientOptionError(f"url={url!r} is not a string; {fix}")
    try:
        u = urllib.parse.urlsplit(url)
        port = u.port
    except ValueError as e:  # "Port out of range 0-65535", "Port could not be cast to integer value"...
        raise ClientOptionError(f"url={url!r}: {e}; {fix}") from None
    if u.scheme != "http" or not u.hostname:
        raise ClientOptionError(f"url={url!r}: {fix}")
    if port == 0:
        raise ClientOptionError(f"url={url!r}: port 0 is no server's port; {fix}")
    return u.hostname, port or 80, u.path.rstrip("/")


class Client:
    """A small client over the standard library: one keep-alive connection (one per thread).

        c = Client("http://127.0.0.1:8000/")
        y = c.predict(x)        # x (t c) or (b t c) numpy -> y of the same shape
        tokens = c.generate([[5, 6, 7]], max_new_tokens=16)   # a whole model's server: (1, 3 + 16) int64

    binary: send .npy/.npz (real sizes) rather than JSON. retries: how many times a request that
    failed on the connection or with a 5xx is sent again (4xx answers are final).
    """

    def __init__(self, url: str, *, binary: bool = True, timeout: float = 60.0, retries: int = 1) -> None:
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ClientOptionError(f"retries={retries!r} must be an integer >= 0")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ClientOptionError(f"timeout={timeout!r} must be positive (seconds)")
        self.host, self.port, self.prefix = parse_url(url)
        self.binary = binary
        self.timeout = timeout
        self.retries = retries
        self.retried = 0  # requests sent again after a failure, over this client's life
        self._conn: http.client.HTTPConnection | None = None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def request(
        self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> Reply:
        """One request, retried on a connection failure or a 5xx up to `retries` times."""
        last: Reply | Exception | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                self.retried += 1
            try:
                reply = self._send(method, path, body, headers or {})
            except (OSError, http.client.HTTPException) as e:
                self.close()
                last = e
                continue
            if reply.status < 500:
                return reply
            last = reply
        if isinstance(last, Reply):
            return last
        raise ClientConnectionError(f"{method} {self.prefix}{path} on {self.host}:{self.port} failed: {last}")

    def _send(self, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> Reply:
        if self._conn is None:
            self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        t0 = time.perf_counter()
        self._conn.request(method, self.prefix + path, body=body, headers=headers)
        resp = self._conn.getresponse()
        data = resp.read()
        seconds = time.perf_counter() - t0
        if resp.will_close:
            self.close()
        return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data, seconds)

    def health(self) -> bool:
        try:
            return self.request("GET", "/healthz").ok
        except ConnectionError:
            return False

    def metadata(self) -> dict[str, Any]:
        reply = self.request("GET", "/metadata")
        if not reply.ok:
            raise ClientError(reply)
        return json.loads(reply.body)

    def encode(self, x, context=None, mask=None, head_mask=None, **cache) -> tuple[bytes, str]:
        """(body, content type) of one request in this client's format; `cache` holds a decode
        model's past_key, past_value and key_mask."""
        unknown = sorted(set(cache) - set(DECODE_FIELDS))
        if unknown:
            raise InputTypeError(f"unknown request field(s) {unknown}; a request has {', '.join(FIELDS)}")
        given = {"x": x, "context": context, "mask": mask, "head_mask": head_mask, **cache}
        arrays = {k: np.asarray(v) for k, v in given.items() if v is not None}
        if not self.binary:
            return json.dumps({k: v.tolist() for k, v in arrays.items()}).encode(), JSON
        buf = io.BytesIO()
        if list(arrays) == ["x"]:
            np.save(buf, arrays["x"], allow_pickle=False)
            return buf.getvalue(), NPY
        np.savez(buf, **arrays)
        return buf.getvalue(), NPZ

    def predict_reply(self, x, context=None, mask=None, head_mask=None) -> Reply:
        body, kind = self.encode(x, context, mask, head_mask)
        return self.request("POST", "/predict", body, {"Content-Type": kind})

    def decode(self, x, past_key=None, past_value=None, key_mask=None):
        """A decode model's step: x (t c) or (b t c) and the cache from the last answer (None for a
        prompt) -> (y, present_key, present_value); pass the presents back as the next past."""
        body, kind = self.encode(x, past_key=past_key, past_value=past_value, key_mask=key_mask)
        reply = self.request("POST", "/predict", body, {"Content-Type": kind})
        if not reply.ok:
            raise ClientError(reply)
        return decode_reply(reply)

    def predict(self, x, context=None, mask=None, head_mask=None):
        """y like x ((t c) or (b t c)); (y, attn) when the model outputs weights. Raises ClientError."""
        reply = self.predict_reply(x, context, mask, head_mask)
        if not reply.ok:
            raise ClientError(reply)
        return decode_reply(reply)

    def generate(self, input_ids, max_new_tokens: int, attention_mask=None, eos_token_id=None) -> np.ndarray:
        """A whole model's greedy tokens (POST /generate): input_ids (t,) or (b, t) -> int64 (t + k,) or
        (b, t + k), the prompt then the new tokens, as OnnxSession.generate returns them. Raises ClientError."""
        doc = {"input_ids": np.asarray(input_ids).tolist(), "max_new_tokens": max_new_tokens}
        if attention_mask is not None:
            doc["attention_mask"] = np.asarray(attention_mask).astype(int).tolist()
        if eos_token_id is not None:
            doc["eos_token_id"] = eos_token_id
        reply = self.request("POST", "/generate", json.dumps(doc).encode(), {"Content-Type": JSON})
        if not reply.ok:
            raise ClientError(reply)
        return np.asarray(json.loads(reply.body)["tokens"], np.int64)


def decode_reply(reply: Reply):
    """The arrays of a successful answer: y, or (y, attn)."""
    kind = reply.headers.get("content-type", "").split(";")[0]
    if kind == NPY:
        return np.load(io.BytesIO(reply.body), allow_pickle=False)
    if kind == NPZ:
        with np.load(io.BytesIO(reply.body), allow_pickle=False) as z:
            outs = tuple(z[k] for k in z.files)
        return outs[0] if len(outs) == 1 else outs
    doc = json.loads(reply.body)
    outs = tuple(np.asarray(v, dtype=np.float32) for v in doc.values())
    return outs[0] if len(outs) == 1 else outs
