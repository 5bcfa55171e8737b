"""Steering: the handle (α·v̂ at one layer), generation and sampling, the PID, the dose-response sweep.

Named ``steering`` rather than ``steer``: ``valueprobe.steer`` is the public function.
"""
