"""Guided decoding: best-of-N, pruning and rollback driven by the value read while generating.

    >>> out = vp.guide(lm, axis, prompts, "prune")      # `valueprobe.guided.run.guide`

Sits above ``steering`` (it reads with the hook layer's recorder and pushes with the steering
handle) and below ``tune``; ``replicate``, ``report`` and ``cli`` use it.
"""
