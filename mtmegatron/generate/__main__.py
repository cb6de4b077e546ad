"""``torchrun --nproc_per_node N -m mtmegatron.generate [flags]``: the same as ``mtmegatron generate``.
May assume: launched by torchrun or as one plain process.
"""

from __future__ import annotations

import argparse
import sys

from mtmegatron.generate.command import main_with_errors
from mtmegatron.config.generate_flags import add_generate_args


def main(argv=None) -> int:
    parser = add_generate_args(argparse.ArgumentParser(prog="mtmegatron.generate", description=__doc__.split("\n")[0]))
    return main_with_errors(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
