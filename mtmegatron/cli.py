"""The ``mtmegatron`` console command: ``env``/``doctor`` (what this machine offers), ``patches`` (what is
changed in megatron-core and why), ``preprocess`` (text -> indexed dataset), ``convert`` (HF <->
megatron-core checkpoints), ``generate`` (text from a checkpoint, mtmegatron/generate/), ``flags`` (how each of
Megatron-LM's flags is treated) and ``plan`` (each rank's memory for a pretrain command line, mtmegatron/plan/). Training itself is ``torchrun -m mtmegatron.pretrain``.
May assume: torch installed; megatron-core imported only by the subcommands that need it.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys

# --help's description: the module docstring's first paragraph, whole (argparse re-flows it)
DESCRIPTION = " ".join(__doc__.split("May assume:")[0].split())


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def cmd_env(args) -> int:
    from mtmegatron.backends import BackendUnavailableError, explain_selection, how_selected, known_backends
    from mtmegatron.backends.registry import availability

    print(f"mtmegatron {_version('mtmegatron')} | python {sys.version.split()[0]}")
    for dist in ("torch", "megatron-core", "torch_musa", "torchada", "transformer-engine"):
        print(f"  {dist:20s} {_version(dist)}")
    rows = availability()
    backends = known_backends()
    print("backends (auto-detect order):")
    for name, reason in rows:
        backend = backends[name]
        state = "available" if reason is None else f"unavailable: {reason}"
        print(f"  {name:5s} device={backend.device_type:5s} kernels={backend.kernel_dispatch_key:11s} {state}")
    try:
        chosen, rows = explain_selection(args.backend)
    except BackendUnavailableError as e:
        print(f"selected: none: {e}")
        return 2
    rule = how_selected(args.backend)
    passed_over = [name for name, _ in rows[: [n for n, _ in rows].index(chosen.name)]]
    print(f"selected: {chosen.name} by {rule} (collectives: {chosen.dist_backend})"
          + (f"; passed over {', '.join(passed_over)} (reasons above)" if rule == "auto-detect" and passed_over else ""))
    from mtmegatron import ops

    print(f"{ops.native.status(chosen.device_type)} | build {ops.BUILD_INFO}")
    print(f"fp8 executors (preferred first): {', '.join(chosen.fp8_executors)}")
    if not chosen.device_is_host:
        print(f"devices: {chosen.device_module().device_count()}")
    for line in chosen.capability_lines():
        print(line)
    from mtmegatron.data import doctor

    doctor.report()
    return 0


def cmd_patches(args) -> int:
    from mtmegatron import patches
    from mtmegatron.backends import select_backend

    backend = select_backend(args.backend)
    version = patches.megatron_version()
    print(f"megatron-core {version} (supported {patches.SUPPORTED_MEGATRON}), backend {backend.name}")
    for patch in patches.all_patches():
        mark = "applies" if patch.applies(version, backend.name) else "skipped"
        print(f"- {patch.name} [{mark}; megatron-core {patch.versions}; backends {','.join(patch.backends)}]")
        print(f"    target: {patch.target}")
        print(f"    why:    {patch.reason}")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse whose mistakes are one line (no usage dump), exit status 2; its subcommands' parsers too."""

    def error(self, message: str):
        print(f"{self.prog}: error: {message} (see --help)", file=sys.stderr, flush=True)
        sys.exit(2)


def main(argv=None) -> int:
    from mtmegatron.utils.quiet import quiet_checkpoint_noise

    quiet_checkpoint_noise()  # before megatron-core is imported: a bad input is then the only line on stderr
    parser = _Parser(prog="mtmegatron", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)
    parser.set_defaults(direction=None)  # only convert's subcommands have one (config/convert_flags.py)
    for name, fn, text in (("env", cmd_env, "show backends, versions, kernels"),
                           ("doctor", cmd_env, "same as env"),
                           ("patches", cmd_patches, "list megatron-core patches and why")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--backend", default=None)
        p.set_defaults(fn=fn)
    from mtmegatron.config import preprocess_flags

    p = preprocess_flags.build_parser(sub.add_parser("preprocess", help="JSONL/text -> megatron-core .bin/.idx"))
    p.set_defaults(fn=preprocess_flags.run)
    from mtmegatron.convert.commands import add_parser as add_convert_parser

    add_convert_parser(sub)
    from mtmegatron.generate.command import main_with_errors
    from mtmegatron.config.generate_flags import add_generate_args

    p = add_generate_args(sub.add_parser("generate", help="generate text from a checkpoint (KV cache, TP/PP)"))
    p.set_defaults(fn=main_with_errors)
    from mtmegatron.config import flag_report

    flag_report.add_flag_report_args(sub)
    sub.add_parser("plan", add_help=False, help="per-rank memory of a pretrain command line (--world-size N ...)")
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["flags"]:  # its arguments are other programs' option strings
        return flag_report.run(argparse.Namespace(names=argv[1:]))
    if argv[:1] == ["plan"]:  # its arguments are the pretrain command line, parsed by mtmegatron.config
        from mtmegatron.plan.command import main as plan_main

        return plan_main(argv[1:])
    args, extras = parser.parse_known_args(argv)
    if extras:
        from mtmegatron.config.flag_help import unknown_flags_message

        command = sub.choices[args.command]
        if args.direction:
            command = command._subparsers._group_actions[0].choices[args.direction]
        command.error(unknown_flags_message(command, extras).removesuffix(" (see --help)"))
    from mtmegatron.backends import BackendUnavailableError
    from mtmegatron.models.families import ConversionError
    from mtmegatron.utils.checkpoint_dirs import CheckpointError
    from mtmegatron.utils.errors import ConfigError, describe_os_error

    # the one error boundary of env/patches/convert (preprocess and generate have their own, with their prefix):
    # a bad input is one line naming the file or flag and why, exit status 2
    try:
        return args.fn(args)
    except (BackendUnavailableError, ConversionError, CheckpointError, ConfigError) as e:
        print(f"mtmegatron: error: {e}", file=sys.stderr, flush=True)
    except OSError as e:  # a file that cannot be read or written (a full disk, a missing directory)
        print(f"mtmegatron: error: {describe_os_error(e)}", file=sys.stderr, flush=True)
    return 2


if __name__ == "__main__":
    sys.exit(main())
