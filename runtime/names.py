"""The run time's names, each spelled once (export/names.py hands them on beside its own).

DEVICES     where a model runs (a concrete ONNX Runtime provider)
PROVIDERS   what a session may be asked for: a device, or "auto" (CUDA where it really works)
"""

DEVICES = ("cpu", "cuda")
PROVIDERS = ("auto", *DEVICES)
