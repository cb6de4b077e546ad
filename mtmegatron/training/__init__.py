"""The training loop and everything only it uses: arguments, the step, checkpoints, evaluation, logging."""
