"""How tokens are drawn under steering: batched rows of (prompt, sample, α), the row sampler with
common random numbers, one request per row for serving, and closed-loop α (the PID)."""
