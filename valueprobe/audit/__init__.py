"""Is it value? Confound tests of an axis against its rival readings, each beside a random null.

    valueprobe audit --probe smollm2-135m-value --out runs/audit-value

See `valueprobe.audit.run` for the battery and docs/guide/audit.md for what each test shows.
"""
