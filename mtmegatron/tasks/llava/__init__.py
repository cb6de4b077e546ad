"""The LLaVA task (``--model llava``): image + conversation data, its forward step, and its end-of-run outputs."""
