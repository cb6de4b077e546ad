"""What a training run reports about itself: throughput/MFU, timers, memory, profiler traces, progress, plots."""
