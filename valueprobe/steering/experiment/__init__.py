"""What a steering experiment records and measures: the sweep (settings, resumable rows, shard
parts), its dose-response records, the behavioural metrics, P(yes) and the live value trace."""
