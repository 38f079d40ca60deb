"""A zoo block's export served: bodies read (JSON, .npy, .npz), requests checked and answered, padded runs,
and the Ray Serve replica (OnnxServer)."""
