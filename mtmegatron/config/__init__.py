"""Every flag and check of mtmegatron's commands: parsing, validation, presets, the report of where each value came
from, and Megatron-LM's flag table. Entry points (pretrain, convert, generate, cli) parse here; the packages below
receive the resolved values.
May assume: nothing imported at package level (submodules import what they need).
"""
