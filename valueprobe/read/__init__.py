"""Reading an axis: val(s), σ-scores of a dataset, the logit lens, readouts of preference items."""
