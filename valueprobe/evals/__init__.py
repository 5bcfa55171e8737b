"""Steered models inside the evaluation harnesses researchers run: lm-evaluation-harness and Inspect AI.

    valueprobe eval --harness lm-eval --task arithmetic --probe smollm2-135m-value --unit norm \\
        --alphas -30,0,30 --random-directions 8 --limit 40 --out runs/eval-arithmetic
    valueprobe export --to lm-eval --probe smollm2-135m-value --alpha 15 --unit norm --layer 20 --out steer.pt

Needs ``pip install "valueprobe[evals]"``. The harness modules (`valueprobe.evals.lm_eval`,
`valueprobe.evals.inspect_model`, `valueprobe.evals.inspect_tasks`) import their harness at the
top, so nothing here imports them: a command reaches them only when it runs.
"""
