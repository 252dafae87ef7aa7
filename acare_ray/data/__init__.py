"""Converters into the searches / training-groups tables: MuSiQue, NeMo JSONL, synthetic data."""
