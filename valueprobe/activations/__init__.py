"""Activation capture: encode a dataset, run it through a route, reduce, and stream shards to a store.

Named ``activations`` rather than ``capture``: ``valueprobe.capture`` is the public function.
"""
