"""The floor every package may import: user-error types and their one-line reporting, rank-0 printing and metrics
writing, checkpoint directory paths, known-noise silencing. Imports nothing from mtmegatron."""
