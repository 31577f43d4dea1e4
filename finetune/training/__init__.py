"""Training: ReviewTrainer and its exact accumulation loop, checkpoints, processes, signals, the model, run folders."""
