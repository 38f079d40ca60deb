"""A whole model's export served: POST /generate requests checked, static batches, the continuous batchers
(left-padded and packed rows) and the Ray Serve replica (GenerateServer), which also carries OpenAI's /v1 routes."""
