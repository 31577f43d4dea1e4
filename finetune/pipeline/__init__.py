"""A run as named stages of plain inputs and outputs, and what the commands share (repeats, flags, a teacher)."""
