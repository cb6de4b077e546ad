"""HSDP (``--num-distributed-optimizer-instances``) and ``--init-model-with-meta-device`` on the cpu backend (gloo).

DP4 = 2 instances x 2 ranks, the tiny llama3, fp32, dropout 0, 5 iterations, one ``torchrun -m mtmegatron.pretrain``
per configuration, each compared with DDP + the distributed optimizer on one rank (ATOL 1e-6; the initial weights are
drawn per full tensor, so data parallelism starts from the one-rank weights and changes the losses by reduction
order only: a 4-rank plain DP4 baseline, measured 2.4e-7 from the one-rank run, was folded away for CI time):
- DDP + the distributed optimizer with 2 instances (megatron-core's partial distributed optimizer: the optimizer
  state sharded over the 2 ranks of an instance, replicated across the instances). Measured: 1.2e-7 from the
  one-rank baseline (<= 1.2e-7 from plain DP4).
- Megatron-FSDP optim_grads with 2 instances (hybrid FSDP: sharded within an instance, gradients all-reduced across
  the instances), its model built on the meta device and materialised module by module by Megatron-FSDP
  (training/meta_init.py). Meta init draws each weight where the host init draws it (patches/
  local_layers_reset_parameters.py), so the losses are the plain run's. Measured: 3.6e-7 from the one-rank
  baseline (identical to plain DP4's); measured by hand
  apart: meta vs non-meta Megatron-FSDP optim_grads at DP2, 5 iterations, identical losses and identical weights.
The combinations megatron-core does not support, or that do not train alike here, are one line each (the HSDP
refusals that replaced the old blanket ones are in test_fsdp.py's table too). Cost: two 4-rank runs of ~25-40 s and one
one-rank run (~6 s).
"""

from __future__ import annotations

import pytest

from helpers.pretrain_runner import TINY, run_pretrain
from mtmegatron.config.arguments import parse_args
from mtmegatron.utils.errors import ConfigError

ITERS = 5
ATOL = 1e-6
DISTOPT = ["--use-distributed-optimizer", "--train-iters", str(ITERS)]
TWO_INSTANCES = ["--num-distributed-optimizer-instances", "2"]
MFSDP_OPTIM_GRADS = ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads", "--overlap-grad-reduce"]
RUNS = {
    "ddp_two_instances": TWO_INSTANCES,
    "megatron_fsdp_hsdp_meta_init": MFSDP_OPTIM_GRADS + TWO_INSTANCES + ["--init-model-with-meta-device"],
}


@pytest.fixture(scope="module")
def losses(tmp_path_factory):
    """name -> the 5 losses of that configuration on 4 ranks (each run once per module; "baseline": DDP + the
    distributed optimizer on one rank)."""
    root, runs = tmp_path_factory.mktemp("hsdp"), {}

    def run(name: str) -> list[float]:
        if name not in runs:
            nproc, extra = (1, []) if name == "baseline" else (4, RUNS[name])
            _, rows = run_pretrain(nproc, TINY + DISTOPT + extra, root / name)
            runs[name] = [r["loss"] for r in rows]
            assert len(runs[name]) == ITERS, rows
        return runs[name]

    return run


@pytest.mark.parametrize("name", list(RUNS))
def test_losses_equal_plain_data_parallel(losses, name):
    baseline, run = losses("baseline"), losses(name)
    assert baseline[-1] < baseline[0] - 0.1, f"the baseline did not learn: {baseline}"
    diff = max(abs(a - b) for a, b in zip(baseline, run))
    print(f"{name}: max |loss - one-rank baseline| = {diff:.3g}")
    assert diff <= ATOL, f"{name}: max |loss - baseline| = {diff:.3g}\n{run}\n{baseline}"


MFSDP = ["--use-megatron-fsdp", "--use-distributed-optimizer"]


@pytest.mark.parametrize("extra, says", [
    (["--init-model-with-meta-device"], "--init-model-with-meta-device needs --use-megatron-fsdp"),
    (["--use-distributed-optimizer", "--num-distributed-optimizer-instances", "3"],
     "--num-distributed-optimizer-instances 3 must divide the data-parallel size x context-parallel size (4"),
    (MFSDP + TWO_INSTANCES + ["--data-parallel-sharding-strategy", "optim_grads"],
     "--num-distributed-optimizer-instances > 1 with --use-megatron-fsdp needs --overlap-grad-reduce"),
    (MFSDP + TWO_INSTANCES + ["--data-parallel-sharding-strategy", "optim", "--overlap-grad-reduce"],
     "--num-distributed-optimizer-instances > 1 with --data-parallel-sharding-strategy optim: megatron-core"),
    (MFSDP + TWO_INSTANCES + ["--data-parallel-sharding-strategy", "optim_grads", "--overlap-grad-reduce",
                              "--outer-dp-sharding-strategy", "optim"],
     "--outer-dp-sharding-strategy optim needs --data-parallel-sharding-strategy optim_grads_params"),
    (["--use-torch-fsdp2"] + TWO_INSTANCES, "--num-distributed-optimizer-instances > 1 needs --use-distributed"),
    (["--use-distributed-optimizer", "--ddp-reduce-scatter-with-fp32-accumulation"] + TWO_INSTANCES,
     "--ddp-reduce-scatter-with-fp32-accumulation with --num-distributed-optimizer-instances > 1"),
    (["--enable-full-sharding-in-hsdp"], "--enable-full-sharding-in-hsdp: Megatron-LM 0.16.1 declares it but"),
])
def test_unsupported_combination_is_one_line(extra, says):
    with pytest.raises(ConfigError) as e:
        parse_args(TINY + ["--train-iters", "1"] + extra, world_size=4)
    assert str(e.value).startswith(says) and "\n" not in str(e.value), str(e.value)


def test_hsdp_and_meta_init_flags_reach_megatron_core():
    """The flags parse into the fields megatron-core reads (parallel_state's instances; the DDP config's and the
    transformer config's fields, filled by name)."""
    from mtmegatron.models.gpt import transformer_config
    from mtmegatron.training.overlap import ddp_config

    args = parse_args(TINY + ["--train-iters", "1"] + MFSDP_OPTIM_GRADS + ["--use-distributed-optimizer"]
                      + TWO_INSTANCES + ["--init-model-with-meta-device"], world_size=4)
    assert ddp_config(args).num_distributed_optimizer_instances == 2
    assert transformer_config(args).init_model_with_meta_device is True


def test_a_module_megatron_fsdp_cannot_materialise_is_named_in_one_line():
    """Megatron-FSDP rebuilds each meta module through its reset_parameters; a module without one is refused before
    the wrap (megatron-core would raise mid-way), naming it."""
    import torch

    from mtmegatron.training.meta_init import check_materialisable

    class Scale(torch.nn.Module):  # a parameter and no reset_parameters
        def __init__(self):
            super().__init__()
            self.gain = torch.nn.Parameter(torch.ones(4))

    with torch.device("meta"):
        chunk = torch.nn.Sequential(torch.nn.Linear(4, 4), Scale())
    with pytest.raises(ConfigError) as e:
        check_materialisable([chunk])
    assert str(e.value).startswith("--init-model-with-meta-device: 1 (Scale) has no reset_parameters"), str(e.value)
    check_materialisable([torch.nn.Sequential(torch.nn.Linear(4, 4))])  # materialisable, and not on meta: passes
