"""The vllm engine: valueprobe's general plugin for vLLM (per-request steering and per-token value
inside its workers), the request payload it reads (a steering spec, α and a readout key), and the
sweep generator built on them (``steer --engine vllm``); ``valueprobe.serve.vllm_engine`` serves it.

Importing this package needs no vLLM; the modules that talk to vLLM import it inside functions.
Inside it, ``import vllm`` is vLLM itself (absolute imports).
"""
