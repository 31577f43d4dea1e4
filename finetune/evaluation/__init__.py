"""Scoring and reporting a trained model: metrics, batched inference, report pictures, the model card."""
