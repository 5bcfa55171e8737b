"""Where value comes from: direct attribution, activation and attribution patching, circuit ablation.

valueprobe attribute --probe probes/smollm2-135m-reward-history --data data/icrl_pairs.jsonl --method direct --out runs/attr
"""
