"""OpenAI's API over a whole model: protocol.py checks /v1 requests and writes answers, chunks and errors in
OpenAI's format; serving.py runs the routes on the replica's continuous batching (OpenAIFront, TextRun)."""
