"""The /v1 routes of an OpenAIFront (serve/openai/serving.py) over a continuous batcher, in this process, behind
the real `openai` client through an ASGI transport: no Ray, no socket (the Ray server is test_openai.py's)."""

from __future__ import annotations

from serve.generate.continuous import ContinuousBatcher
from serve.openai.serving import OpenAIFront, text_files


def front(sess, lm_path, max_rows: int = 4, capacity: int = 512, make=ContinuousBatcher, **kw) -> OpenAIFront:
    """make(sess, max_rows=, capacity=) -> the continuous batcher (made on the first request)."""
    own: list = []

    def batcher(made: bool = False):
        if made:
            return list(own)
        if not own:
            own.append(make(sess, max_rows=max_rows, capacity=capacity))
        return own[0]

    limits = {"max_new": 400, "max_positions": capacity, "capacity": capacity, "server_max_body": 1 << 20}
    return OpenAIFront(sess, batcher, "chat", "attnzoo-test", text_files(lm_path), **limits, **kw)


def client(the_front):
    """An openai.AsyncOpenAI whose requests go to `the_front` through ASGI."""
    import httpx2
    import openai
    from starlette.applications import Starlette
    from starlette.routing import Route

    async def endpoint(request):
        return await the_front.handle(request, request.url.path)

    app = Starlette(routes=[Route("/v1/{rest:path}", endpoint, methods=["GET", "POST"])])
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://attnzoo.test")
    return openai.AsyncOpenAI(base_url="http://attnzoo.test/v1", api_key="none", http_client=http, max_retries=0)
