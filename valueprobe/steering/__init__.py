"""Steering along an axis, in three folders that each answer one question.

- `hook`: how a hook changes h: the spec (what to steer), the operators, the conditions and the
  handle that applies them at every forward; the steering vectors other tools read.
- `decode`: how tokens are drawn under steering: batched sweeps of rows, the sampler with common
  random numbers, one request per row (serving), closed-loop α.
- `experiment`: what an experiment records and measures: the sweep and its settings, its parts,
  dose-response records, behavioural metrics, P(yes), the live value trace.

Imports point down: ``experiment`` → ``decode`` → ``hook`` (pyproject's import-linter contract).
Named ``steering`` rather than ``steer``: ``valueprobe.steer`` is the public function.
"""
