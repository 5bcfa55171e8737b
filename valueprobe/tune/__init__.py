"""Tuning (TRL + peft LoRA), preference pairs, and the shift of a probe's reading between two checkpoints."""
