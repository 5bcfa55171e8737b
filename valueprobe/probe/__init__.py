"""Fitting the value axis: fitters, the ``ValueAxis`` artifact, the layer sweep, transfer, baselines."""
