"""``config/transformer_impl``: where ``--transformer-impl transformer_engine`` gets TE layers, with TE faked.

- which TransformerEngine serves which backend: NVIDIA's on CUDA, MT-TransformerEngine (the ``transformer_engine``
  package with a ``musa`` subpackage, found on disk) on MUSA, none on cpu -- the package spec faked, nothing imported;
- Megatron-LM's implicit default falls back to local layers with one start-up line naming why; the same flag
  given explicitly is one clear error (exit 2 before any process group, through the real command line);
- TE available (faked): bf16 runs keep ``transformer_engine``; an FP8 run whose ``--fp8-executor`` is one of ours
  falls back / is refused the same way.
"""

from __future__ import annotations

import importlib.machinery
from types import SimpleNamespace
from unittest import mock

import pytest

from mtmegatron.backends.cpu import CPU, CpuBackend
from mtmegatron.backends.cuda import CUDA
from mtmegatron.backends.musa import MUSA
from mtmegatron.config import transformer_impl
from mtmegatron.config.arguments import parse_args
from mtmegatron.utils.errors import ConfigError

TINY = ["--model", "llama3", "--model-size", "tiny", "--mock-data"]


def backend(device_type, te_missing=None):
    """A backend description whose TransformerEngine answer is faked."""
    return SimpleNamespace(name=device_type, device_type=device_type, fp8_executors=CUDA.fp8_executors,
                           transformer_engine_missing=lambda: te_missing)


def _te_spec(tmp_path, mt: bool):
    package = tmp_path / "transformer_engine"
    package.mkdir()
    if mt:
        (package / "musa").mkdir()
    spec = importlib.machinery.ModuleSpec("transformer_engine", None, is_package=True)
    spec.submodule_search_locations = [str(package)]
    return spec


@pytest.mark.parametrize("installed,device,ok,why", [
    (None, "cuda", False, "TransformerEngine is not installed"),
    ("nvidia", "cuda", True, None),
    (None, "musa", False, "MT-TransformerEngine is not installed"),
    ("nvidia", "musa", False, "NVIDIA's build, not MT-TransformerEngine"),
    ("mt", "musa", True, None),
    ("nvidia", "cpu", False, "no layers for the cpu backend"),
    ("mt", "cpu", False, "no layers for the cpu backend"),
])
def test_which_transformer_engine_serves_which_backend(tmp_path, installed, device, ok, why):
    spec = None if installed is None else _te_spec(tmp_path, mt=installed == "mt")
    with mock.patch("importlib.util.find_spec", return_value=spec):
        reason = {"cuda": CUDA, "musa": MUSA, "cpu": CPU}[device].transformer_engine_missing()
    assert (reason is None) == ok
    if why:
        assert why in reason


def test_implicit_default_falls_back_to_local_with_one_line():
    args = parse_args(TINY + ["--backend", "cpu"], world_size=1)  # Megatron-LM's default, not given
    assert args.transformer_impl == "local"
    assert args.impl_note == ("--transformer-impl transformer_engine (Megatron-LM's default): TransformerEngine "
                              "has no layers for the cpu backend; running local layers")


def test_explicit_transformer_engine_without_te_is_one_clear_error(tmp_path):
    with pytest.raises(ConfigError, match=r"^--transformer-impl transformer_engine: TransformerEngine has no layers "
                                          r"for the cpu backend \(or use --transformer-impl local / mtmegatron\)$"):
        parse_args(TINY + ["--backend", "cpu", "--transformer-impl", "transformer_engine"], world_size=1)
    from helpers.pretrain_runner import TINY as RUN_TINY, run_pretrain

    proc, _ = run_pretrain(1, RUN_TINY + ["--train-iters", "1", "--transformer-impl", "transformer_engine"], tmp_path,
                           expect_ok=False)
    assert proc.returncode == 2
    assert "--transformer-impl transformer_engine: TransformerEngine has no layers for the cpu backend" in proc.stderr


@pytest.mark.parametrize("given", [False, True])
def test_te_available_keeps_te_in_bf16(given):
    flag = ["--transformer-impl", "transformer_engine"] if given else []
    with mock.patch.object(transformer_impl, "_backend", return_value=backend("cuda")):
        args = parse_args(TINY + ["--bf16"] + flag, world_size=1)
    assert args.transformer_impl == "transformer_engine" and args.impl_note is None


def test_te_available_but_our_fp8_executor():
    fp8 = ["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--bf16", "--fp8-executor", "scaled_mm"]
    with mock.patch.object(transformer_impl, "_backend", return_value=backend("cuda")):
        args = parse_args(TINY + fp8, world_size=1)
        assert args.transformer_impl == "local"
        assert "--fp8-executor scaled_mm runs FP8 in mtmegatron's linears" in args.impl_note
        with pytest.raises(ConfigError, match="--fp8-executor scaled_mm runs FP8 in mtmegatron's linears"):
            parse_args(TINY + fp8 + ["--transformer-impl", "transformer_engine"], world_size=1)


def test_device_of_the_selected_backend_decides():
    with mock.patch.object(CpuBackend, "transformer_engine_missing", return_value=None) as missing:
        args = parse_args(TINY + ["--backend", "cpu"], world_size=1)
    missing.assert_called_once_with()
    assert args.transformer_impl == "transformer_engine"  # the (faked) answer for the cpu backend is honoured


def test_one_te_decision_read_by_every_consumer():
    """``args.transformer_engine_layers`` is decided once; the layer spec, the grouped-experts checks and the FP8
    executor read it. FP8 ``auto`` under ``--transformer-impl local`` on a backend whose first executor is TE's
    (faked CUDA with TE): TE layers, so grouped GEMM is TE's grouped linears, not refused as 'needs TE'."""
    from mtmegatron.fp8 import spec as fp8_spec
    from mtmegatron.fp8.section import Fp8
    from mtmegatron.models.gpt import layer_choice
    from mtmegatron.models.layer_spec import build_layer_spec

    cuda = backend("cuda")
    moe = ["--model", "mixtral", "--model-size", "tiny", "--mock-data", "--transformer-impl", "local",
           "--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--bf16", "--moe-grouped-gemm",
           "--disable-bias-linear"]
    with mock.patch.object(transformer_impl, "_backend", return_value=cuda):
        args = parse_args(moe, world_size=1)
    args.fp8_executor_in_use = "transformer_engine"  # what pretrain records; TE is never imported here
    assert args.transformer_engine_layers and layer_choice(args).transformer_engine
    assert build_layer_spec(layer_choice(args), "moe").submodules.mlp.submodules.experts.module.__name__ == "TEGroupedMLP"
    # MUSA with NVIDIA's TE installed: not TE's layers, and the executor choice then skips TE's executor too
    musa = backend("musa", te_missing="NVIDIA's build")
    with mock.patch.object(transformer_impl, "_backend", return_value=musa), \
            pytest.raises(ConfigError, match="needs TransformerEngine's grouped linears"):
        parse_args(moe, world_size=1)
    with mock.patch.object(transformer_impl, "_backend", return_value=musa):
        args = parse_args(moe[:-2], world_size=1)
    assert not args.transformer_engine_layers
    musa.set_device = lambda rank: None

    def missing(name, backend):  # TE's executor would import; scaled_mm does not run on this (faked) device
        return "faked: no scaled_mm" if name == "scaled_mm" else None

    with mock.patch("mtmegatron.backends.active._active", musa), \
            mock.patch("mtmegatron.fp8.probe.executor_missing", side_effect=missing), \
            mock.patch.object(fp8_spec, "executor_missing", side_effect=missing):
        executor, _ = fp8_spec.choose_executor(Fp8.of(args), args.transformer_engine_layers, local_rank=0)
        assert executor == "emulated"  # before: TE's executor, local layers
