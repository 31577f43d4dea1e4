"""Cheaper readings of a classifier for the same logits, one module per model family; enter through readings.py."""
