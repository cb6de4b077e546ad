"""Every flag and check of mtmegatron's commands: parsing, validation, presets, the report of where each value came
from, and Megatron-LM's flag table. Entry points (pretrain, convert, generate, cli) parse here; the packages below
receive the resolved values.
May assume: nothing imported at package level (submodules import what they need).
"""


def parse(argv=None, world_size: int | None = None, for_training: bool = True):
    """``mtmegatron.config.parse(argv) -> RunConfig`` (config/run_config.py): the one entry, imported on use."""
    from mtmegatron.config.run_config import parse as parse_run_config

    return parse_run_config(argv, world_size=world_size, for_training=for_training)
