"""torch_musa.core: the device runtime surface (device, streams, memory, RNG) of the simulated MUSA device."""
