"""The predicted-footprint line every ``pretrain`` run prints at start-up (rank 0): the planner's peak for rank 0's
position (pipeline stage 0, TP/CP/DP/EP rank 0) from the run's own parsed arguments -- weights, gradients,
optimizer state, activations (times the in-flight micro-batches), buffers and the peak, in MiB -- to be read beside
Megatron-LM's "max allocated" memory line after the first iterations. Only stage 0 is built, on the meta device
(plan/params.py), so the line costs a few tens of milliseconds on a tiny model.
A failure of the planner never stops training: the line then says ``predicted footprint: unavailable (<reason>)``.
May assume: called by pretrain.prepare after the backend is active and before any process group exists (the meta
build opens and closes its own one-process group, plan/rank_state.py).
"""

from __future__ import annotations

MIB = 2**20


def footprint_line(args) -> str:
    """One start-up line; never raises (the reason of a failure is in the line)."""
    try:
        from mtmegatron.plan.memory import rank_memory
        from mtmegatron.plan.params import cpu_backend_unless_active, stage_params
        from mtmegatron.plan.rank_state import Layout

        with cpu_backend_unless_active():
            stage = stage_params(args, 0)
        m = rank_memory(args, stage, Layout.of(args))
    except Exception as e:  # noqa: BLE001 -- the planner must never stop a training run
        reason = " ".join(f"{type(e).__name__}: {e}".split())
        return f"mtmegatron: predicted footprint: unavailable ({reason[:200]})"
    return (f"mtmegatron: predicted footprint (rank 0, mtmegatron plan; MiB): weights {m.weights / MIB:.1f} | "
            f"gradients {m.gradients / MIB:.1f} | optimizer {m.optimizer / MIB:.1f} | activations "
            f"{m.activations / MIB:.1f} (x{m.in_flight} in flight) | buffers {m.buffers / MIB:.1f} | peak "
            f"{m.peak / MIB:.1f}")
