"""The native-resolution vision-language task (Qwen2-VL, Qwen2.5-VL): packed images/videos + conversations, the
forward step, and the answer evaluation at the end of a run."""
