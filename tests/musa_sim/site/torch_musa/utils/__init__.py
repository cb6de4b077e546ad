"""torch_musa.utils stand-in (only musa_extension, which torchada imports)."""
