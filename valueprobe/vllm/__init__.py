"""Engines other than transformers: vLLM's general plugin (per-request steering and per-token value
inside its workers), its request record, and the vLLM sweep and serving engine built on them.

Importing this package needs no vLLM; the modules that talk to vLLM import it inside functions.
"""
