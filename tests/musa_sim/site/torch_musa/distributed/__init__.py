"""torch_musa.distributed: the simulated "mccl" collective backend (see mccl.py)."""
