"""Serving: an OpenAI-compatible HTTP server whose requests steer and whose responses carry the value.

    valueprobe serve --probe probes/smollm2-135m-value --engine hf --port 8000

`engine` is the contract between the HTTP layer (`app`, `protocol`) and an engine (`hf_engine`
batches concurrent requests with one α per row on the transformers path; the vLLM engine runs
stock vLLM with valueprobe's plugin). `limits` checks a request's steering and states the probe;
`workbench` is the page at ``/`` (``valueprobe explore``) and the routes it reads; `guard` decides
who may call (the key, the page's cookie, no other origin).
"""
