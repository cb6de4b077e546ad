"""Megatron-LM's resilience flags on one rank of a tiny Llama: the rerun engine (``--rerun-mode validate_results``,
Megatron-LM's default; ``--check-for-spiky-loss``; NaN checks), non-persistent checkpoints
(``--non-persistent-save-interval``, ``--non-persistent-ckpt-type global``) and the start-up lines of
``--record-memory-history`` / ``--use-persistent-ckpt-worker`` on the cpu backend.

Four runs, shared by the tests (module fixture), 16 micro-batches per step so that the spiky-loss check has its
100 samples after 7 validated steps:
- ``full``: 16 iterations, persistent saves every 4, non-persistent every 2; a persistent NaN loss injected at
  step 16 (every run of it): the step is re-run, the NaN reproduced, a checkpoint of step 15 saved, status 16;
- ``killed``: the same flags, killed (-9) inside the persistent save of iteration 8;
- ``resumed``: ``--load`` of the killed run's directory takes the non-persistent checkpoint of iteration 6 (newer
  than the persistent one of 4); a spike (1000x loss) injected once at step 15 is re-run and the run goes on with
  the losses of the unfaulted run;
- ``rerun``: ``--load`` of the NaN run's re-run checkpoint re-runs step 16; on the same device the machine asks to
  be resumed again (status 16), as Megatron-LM's does.
"""

from __future__ import annotations

import json
import os
import signal

import pytest

from helpers.launch import finish, launch, wait_for
from helpers.pretrain_runner import TINY, run_pretrain

_SIZES = {"--micro-batch-size": "1", "--global-batch-size": "16"}
BASE = [(_SIZES.get(TINY[i - 1], a) if i else a) for i, a in enumerate(TINY)]
FLAGS = BASE + ["--train-iters", "16", "--check-for-spiky-loss", "--save-interval", "4",
                "--non-persistent-save-interval", "2", "--non-persistent-ckpt-type", "global"]
INJECT = "MTMEGATRON_TEST_INJECT_LOSS"


def _losses(log_dir) -> dict[int, float]:
    return {r["iteration"]: r["loss"] for r in map(json.loads, (log_dir / "metrics.jsonl").read_text().splitlines())}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("resilience")
    full, _ = run_pretrain(1, FLAGS + ["--save", str(tmp / "full"), "--record-memory-history",
                                       "--use-persistent-ckpt-worker"], tmp / "full_log", expect_ok=False,
                           env={INJECT: "16:nan:always"})
    killed_dir = tmp / "killed"
    proc = launch(1, FLAGS + ["--save", str(killed_dir)], tmp / "killed_log",
                  {"MTMEGATRON_TEST_PAUSE_IN_SAVE": "8:0"})
    marker = killed_dir / "paused-rank0"
    wait_for(marker.exists, proc, what="the rank to pause inside the save of iteration 8")
    os.kill(int(wait_for(lambda: marker.read_text().strip(), proc, what="pid")), signal.SIGKILL)
    finish(proc)
    resumed, _ = run_pretrain(1, FLAGS + ["--save", str(killed_dir), "--load", str(killed_dir)], tmp / "resumed_log",
                              env={INJECT: "15:spike:once"})
    # the re-run checkpoint re-runs step 16, here on the same device: Megatron-LM's "resume again" (16 again)
    rerun, _ = run_pretrain(1, FLAGS + ["--save", str(tmp / "full"), "--load", str(tmp / "full")], tmp / "rerun_log",
                            expect_ok=False)
    return {"tmp": tmp, "full": full, "killed_rc": proc.returncode, "resumed": resumed, "rerun": rerun,
            "full_losses": _losses(tmp / "full_log"), "resumed_losses": _losses(tmp / "resumed_log")}


def test_persistent_nan_is_rerun_then_saved_and_exits_16(runs):
    from megatron.core import dist_checkpointing

    full, tmp = runs["full"], runs["tmp"]
    assert full.returncode == 16, full.stderr[-3000:]
    assert "Unexpected result nan on rank 0 at iteration #16" in full.stderr
    assert "First rerun: unexpected result is reproducible within the tolerance (nan = nan)" in full.stderr
    assert (f"mtmegatron: rerun: step 16: the rejected result was reproduced: resume from the checkpoint on another "
            f"device to re-run the step there; saved {tmp / 'full' / 'iter_0000015'} (the state before step 16); "
            f"exiting with status 16") in full.stdout
    assert sorted(runs["full_losses"]) == list(range(1, 16))  # step 16 never reached the weights or the log
    assert (tmp / "full" / "latest_checkpointed_iteration.txt").read_text() == "15"
    common = dist_checkpointing.load_common_state_dict(str(tmp / "full" / "iter_0000015"))
    assert common["rerun_state_machine"]["current_iteration"] == 16  # the step to re-run on another device
    assert common["rerun_state_machine"]["state"].name == "WILL_RERUN_FROM_CHECKPOINT"


def test_the_rerun_checkpoint_reruns_the_step_when_resumed(runs):
    rerun = runs["rerun"]
    assert rerun.returncode == 16, rerun.stderr[-3000:]
    assert "continuing at iteration 15" in rerun.stdout
    assert "Getting RerunStateMachine state from checkpoint. Will rerun step." in rerun.stderr
    assert "Got rescheduled on the same GPU. Need to resume again from the same checkpoint" in rerun.stderr
    assert "mtmegatron: rerun: step 16: the rejected result was reproduced" in rerun.stdout
    assert not (runs["tmp"] / "rerun_log" / "metrics.jsonl").exists() or not (
        runs["tmp"] / "rerun_log" / "metrics.jsonl").read_text().strip()  # step 16 was never applied
    assert (runs["tmp"] / "full" / "latest_checkpointed_iteration.txt").read_text() == "15"


def test_start_up_lines_say_what_each_flag_does(runs):
    out = runs["full"].stdout
    assert ("mtmegatron: --rerun-mode validate_results: validates NaN/Inf loss and gradients and spiky loss (10x) "
            "from the second step on") in out
    assert f"non-persistent checkpoints every 2 iterations in {runs['tmp'] / 'full' / 'non_persistent'}" in out
    assert "--use-persistent-ckpt-worker: no effect" in out
    assert "--record-memory-history: records nothing on the cpu backend" in out
    assert not (runs["tmp"] / "snapshot.pickle").exists() and not os.path.exists("snapshot.pickle")


def test_only_the_newest_non_persistent_checkpoint_is_kept(runs):
    tmp = runs["tmp"]
    # persistent saves at 4, 8, 12 and the re-run's 15; non-persistent ones at 2, 6, 10, 14: only 14 is left
    assert sorted(p.name for p in (tmp / "full" / "non_persistent").iterdir()) == [
        "iter_0000014", "latest_checkpointed_iteration.txt"]
    assert sorted(p.name for p in (tmp / "full").glob("iter_*")) == [
        "iter_0000004", "iter_0000008", "iter_0000012", "iter_0000015"]


def test_killed_run_resumes_from_the_newer_non_persistent_checkpoint(runs):
    assert runs["killed_rc"] != 0
    out = runs["resumed"].stdout
    assert "the non-persistent checkpoint in" in out and "continuing at iteration 6" in out, out[-3000:]
    resumed, full = runs["resumed_losses"], runs["full_losses"]
    assert sorted(resumed) == list(range(7, 17))
    assert all(resumed[i] == full[i] for i in range(7, 16)), (resumed, full)


def test_transient_spike_is_rerun_and_the_run_goes_on_unchanged(runs):
    err = runs["resumed"].stderr
    assert "Unexpected result" in err and "at iteration #15 invocation #1 (message='Spiky loss')" in err
    assert "First rerun: unexpected result is not reproducible within the tolerance" in err
    assert "Possible transient error!" in err
    assert "Continuing normal execution because failed validation was not fatal" in err
    assert runs["resumed_losses"][15] == runs["full_losses"][15]  # the re-run's result, not the spike's


class _Memory:
    """A device module's ``memory`` as the recorder sees it: calls noted, a snapshot of what was recorded."""

    def __init__(self):
        self.calls = []

    def _record_memory_history(self, *args, **kwargs):
        self.calls.append((args, kwargs))

    def _snapshot(self):
        return {"segments": [], "device_traces": [[{"action": "alloc"}]]}


def test_record_memory_history_records_on_a_device_and_writes_snapshots(tmp_path, capsys):
    """The device path with a stand-in device module (no GPU in CI): Megatron-LM's recorder call, a pickle after
    the first step and every --log-interval steps; on the cpu backend one line and nothing recorded."""
    import pickle
    from types import SimpleNamespace

    from mtmegatron.training.observability.memory_history import MemoryHistory

    memory = _Memory()
    device = SimpleNamespace(name="sim", device_type="sim", device_is_host=False,
                             device_module=lambda: SimpleNamespace(memory=memory))
    path = tmp_path / "snap.pickle"
    args = SimpleNamespace(record_memory_history=True, memory_snapshot_path=str(path), log_interval=3)
    history = MemoryHistory(args, device, rank=0)
    assert memory.calls == [((True,), {"trace_alloc_max_entries": 100000, "trace_alloc_record_context": True})]
    written = []
    for iteration in range(5, 10):
        path.unlink(missing_ok=True)
        history.after_step(iteration, first=iteration == 5)
        if path.exists():
            written.append(iteration)
            assert pickle.loads(path.read_bytes())["device_traces"] == [[{"action": "alloc"}]]
    assert written == [5, 6, 9]
    path.unlink()
    MemoryHistory(args, SimpleNamespace(name="cpu", device_type="cpu", device_is_host=True), rank=0).after_step(6, first=True)
    assert "records nothing on the cpu backend" in capsys.readouterr().out and not path.exists()
