"""megatron-core's local tensor-parallel layers can re-draw their weights: a ``reset_parameters`` method.

Target: megatron.core.tensor_parallel.layers: ColumnParallelLinear / RowParallelLinear / VocabParallelEmbedding
``__init__`` (each class gains ``reset_parameters``).
Reason: ``--init-model-with-meta-device`` builds the model on the meta device and Megatron-FSDP materialises it one
module at a time, calling each module's ``reset_parameters`` (megatron-core 0.16.1's ``ParamAndGradBuffer``; it
raises ValueError for a module without one). TransformerEngine's layers have it; megatron-core's local layers (the
only ones without TE) do not. The method added here re-runs exactly the initialisation their ``__init__`` ran: the
weight through megatron-core's ``_initialize_affine_weight_cpu`` (host init: the full master weight drawn from the
host generator, this TP rank's slice kept) or ``_initialize_affine_weight_gpu`` (device init: the RNG tracker),
with the same init method, sizes, stride and TP rank; a bias to zero. Nothing is drawn with
``perform_initialization=False``. ``__init__`` records what it needs (``_mtm_init``); it is otherwise unchanged,
except for a weight born on the meta device under host init: there it records the host generator's state and
draws one throwaway full weight on the host, so that the re-draw gives the weight a run without the meta device
has, whatever order Megatron-FSDP resets the modules in (its buffer order: parameters sorted by row length).
The MoE router (megatron.core.transformer.moe.router:Router.reset_parameters, megatron-core's own, which its
``__init__`` calls) records and replays its host draws the same way.
Versions: megatron-core 0.16.x.
"""

from __future__ import annotations

from .base import Patch, current, set_attr, undo_in_reverse

LAYERS = "megatron.core.tensor_parallel.layers"
CLASSES = ("ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding")


def _recording_init(original, class_name: str):
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if class_name == "VocabParallelEmbedding":
            num_embeddings, embedding_dim = (list(args) + [None, None])[:2]
            full = (kwargs.get("num_embeddings", num_embeddings), kwargs.get("embedding_dim", embedding_dim))
        else:
            input_size, output_size = (list(args) + [None, None])[:2]
            input_size, output_size = kwargs.get("input_size", input_size), kwargs.get("output_size", output_size)
            full = (output_size, input_size)
        self._mtm_init = dict(config=kwargs["config"], init_method=kwargs["init_method"], full_shape=full,
                              stride=kwargs.get("stride", 1), is_expert=kwargs.get("is_expert", False),
                              partition_dim=1 if class_name == "RowParallelLinear" else 0,
                              host_rng_state=_claim_host_draw(self, kwargs["config"], kwargs["init_method"], full))

    return __init__


def _claim_host_draw(layer, config, init_method, full_shape):
    """For a weight born on the meta device under host init: the host generator's state where the host init would
    have drawn it, and the generator moved past that draw (one throwaway full weight on the host), so that the
    draws after it -- and this weight's own draw in ``reset_parameters``, whenever Megatron-FSDP calls it -- are
    those of a run without the meta device."""
    import torch

    weight = getattr(layer, "weight", None)
    if weight is None or not weight.is_meta or not config.use_cpu_initialization or not config.perform_initialization:
        return None
    state = torch.get_rng_state()
    init_method(torch.empty(*full_shape, dtype=torch.float, device="cpu"))
    return state


def reset_parameters(self) -> None:
    """Draw this layer's weight (and zero its bias) as its ``__init__`` did."""
    import torch
    from megatron.core.tensor_parallel.layers import _initialize_affine_weight_cpu, _initialize_affine_weight_gpu
    from megatron.core.utils import get_pg_rank, get_pg_size

    init = self._mtm_init
    config = init["config"]
    if not config.perform_initialization:
        return
    weight, dim = getattr(self, "weight", None), init["partition_dim"]
    if weight is not None:
        if config.use_cpu_initialization:
            output_size, input_size = init["full_shape"]
            later = torch.get_rng_state()
            if init["host_rng_state"] is not None:  # the draw this weight had in the build (_claim_host_draw)
                torch.set_rng_state(init["host_rng_state"])
            _initialize_affine_weight_cpu(weight, output_size, input_size, weight.shape[dim], dim,
                                          init["init_method"], stride=init["stride"],
                                          params_dtype=config.params_dtype, rank=get_pg_rank(self.tp_group),
                                          world_size=get_pg_size(self.tp_group))
            if init["host_rng_state"] is not None:
                torch.set_rng_state(later)
        else:
            _initialize_affine_weight_gpu(weight, init["init_method"], partition_dim=dim, stride=init["stride"],
                                          is_expert=init["is_expert"])
    bias = getattr(self, "bias", None)
    if bias is not None:
        with torch.no_grad():
            bias.zero_()


ROUTER_RESET = "megatron.core.transformer.moe.router:Router.reset_parameters"


def _replaying_router_reset(original):
    """The MoE router draws its weight (and bias) in ``__init__`` through its own ``reset_parameters``, from the
    host generator on the host path. Born on the meta device it claims those draws (state recorded, throwaway draws
    made); Megatron-FSDP's later call replays them on the host and copies them in."""

    def reset_parameters(self):
        import torch

        params = [p for p in (self.weight, self.bias) if p is not None]
        state = getattr(self, "_mtm_host_rng_state", None)
        if self.weight.is_meta and self.config.perform_initialization:
            self._mtm_host_rng_state = torch.get_rng_state()
            for p in params:
                self.config.init_method(torch.empty(p.shape, dtype=torch.float32, device="cpu"))
        elif state is not None:
            later = torch.get_rng_state()
            torch.set_rng_state(state)
            for p in params:
                drawn = torch.empty(p.shape, dtype=torch.float32, device="cpu")
                self.config.init_method(drawn)
                with torch.no_grad():
                    p.copy_(drawn)
            torch.set_rng_state(later)
            return
        original(self)

    return reset_parameters


def apply():
    undos = [set_attr(ROUTER_RESET, _replaying_router_reset(current(ROUTER_RESET)))]
    for name in CLASSES:
        target = f"{LAYERS}:{name}.__init__"
        undos.append(set_attr(target, _recording_init(current(target), name)))
        undos.append(set_attr(f"{LAYERS}:{name}.reset_parameters", reset_parameters, must_exist=False))
    return undo_in_reverse(undos)


PATCH = Patch(
    name="local_layers_reset_parameters",
    target=f"{LAYERS}:ColumnParallelLinear.__init__",  # and RowParallelLinear / VocabParallelEmbedding (CLASSES)
    reason="--init-model-with-meta-device: Megatron-FSDP materialises each meta module through its "
    "reset_parameters, which megatron-core's local (non-TE) tensor-parallel layers lack; added, re-running their "
    "own initialisation",
    versions=">=0.16,<0.17",
    apply=apply,
)
