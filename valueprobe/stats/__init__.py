"""Statistics with no model in them: metrics, random-direction nulls, bootstrap intervals."""
