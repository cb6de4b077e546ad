"""Runs that survive faults: result validation (the rerun state machine), steps that must not reach the weights,
clean stops on signals and time limits, process-group timeouts, and the torchrun exit status."""
