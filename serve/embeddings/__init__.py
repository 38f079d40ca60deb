"""A sentence encoder's export served on OpenAI's POST /v1/embeddings: requests checked and answered
(protocol.py), their rows in length-sorted padded runs across requests (batching.py), the replica (app.py)."""
