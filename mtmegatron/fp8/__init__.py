"""FP8 training on every backend: recipes (recipes.py), scale rules (scaling.py), quantize/dequantize ops
(quantize.py), GEMM executors (executors.py), delayed-scaling state (state.py), FP8 column/row-parallel linears
for the local spec (linear.py) and the spec/model wiring used by models/gpt.py (spec.py). See docs/fp8.md.
May assume: torch >= 2.7; megatron-core only where linear.py/spec.py are imported.
"""

from .recipes import (FORMATS, RECIPES, BlockwiseScaling, DelayedScaling, MXFP8Scaling, Recipe,  # noqa: F401
                      TensorwiseScaling, recipe_of)
