"""Loading a model (hub id, local folder, PyPI GGUF, LoRA adapter folder) and its fingerprint."""
