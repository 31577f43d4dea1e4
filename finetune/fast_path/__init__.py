"""Cheaper readings of a BERT or MPNet classifier (packed rows, first tokens, masks, SDPA), installed for a run."""
