"""Optimizer CPU offload on the simulated MUSA device (tests/musa_sim: device memory that is not host memory, an
``mccl`` that refuses host tensors), against the same command on ``--backend cpu``.

DP2 + distributed optimizer, ``--use-precision-aware-optimizer --optimizer-cpu-offload
--optimizer-offload-fraction 0.5``, tiny llama3, 10 iterations (the CPU run is test_offload.py's offloaded DP2
run, shared through the ``offload_runs`` session fixture), with and without ``--overlap-cpu-optimizer-d2h-h2d``:
* losses equal the cpu backend's within 1e-5 absolute per iteration (the simulator runs the CPU kernels, so a
  larger difference is a placement or copy bug; measured: at most 4.2e-7, with and without overlap - the SDPA
  attention kernels for host and device tensors differ by ~1e-7 in fp32, as in the lane);
* the states really are split (offload_stats per rank): host and device bytes > 0, nothing misplaced, the
  device-side states on ``musa:<rank>`` only and the host-side ones on ``cpu`` only, D2H and H2D copies made;
* with the overlap flag every copy ran on the optimizer's own side stream (a musa stream that is not the
  default one) and none without it;
* the start-up placement check passed (it now requires the offloaded states on ``cpu``), every rank's ``mccl``
  ran collectives and refused no host tensor.
"""

from __future__ import annotations

import pytest

from helpers.musa_sim import read_stats, sim_env
from helpers.offload_runs import BASE, ITERS, dp2_offload

pytestmark = pytest.mark.musa_sim

LOSS_TOL = 1e-5
MUSA = [a for a in BASE if a not in ("--backend", "cpu")] + [
    "--backend", "musa", "--use-precision-aware-optimizer", "--optimizer-cpu-offload",
    "--optimizer-offload-fraction", "0.5",
    "--use-cpu-initialization"]  # the cpu backend's (host) weights; the device init is tests/musa_sim/test_device_init.py


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap_d2h_h2d"])
def test_offload_on_the_simulated_device_matches_cpu_and_splits_the_states(offload_runs, overlap):
    cpu = dp2_offload(offload_runs, "0.5")
    name = "musa_off0.5" + ("_overlap" if overlap else "")
    sim_stats = offload_runs.root / name / "sim"
    run = offload_runs(name, 2, MUSA + (["--overlap-cpu-optimizer-d2h-h2d"] if overlap else []),
                       env=sim_env({"MUSA_SIM_STATS_DIR": str(sim_stats)}), timeout=500)

    assert [r["iteration"] for r in run.rows] == list(range(1, ITERS + 1))
    diffs = [abs(m - c) for m, c in zip(run.losses, cpu.losses)]
    assert max(diffs) <= LOSS_TOL, (diffs, run.losses, cpu.losses)
    assert run.losses[-1] < run.losses[0]

    assert "backend musa (mccl)" in run.stdout and "placement: all" in run.stdout, run.stdout[-2000:]
    expected_streams = "musa side streams" if overlap else "musa current stream"
    for rank in (0, 1):
        s, c = run.stats(rank), cpu.stats(rank)
        assert s["offload"] and s["streams"] == expected_streams, s
        assert s["host_state_bytes"] > 0 and s["device_state_bytes"] > 0 and s["misplaced_state_bytes"] == 0, s
        by_device = s["state_bytes_by_device"]
        assert set(by_device["device"]) == {f"musa:{rank}"} and set(by_device["host"]) == {"cpu"}, s
        # the same split as on the cpu backend, now on two memories
        assert by_device["device"][f"musa:{rank}"] == c["state_bytes_by_device"]["device"]["cpu"], (s, c)
        assert by_device["host"]["cpu"] == c["state_bytes_by_device"]["host"]["cpu"], (s, c)
        assert s["d2h_copies"] == s["h2d_copies"] == ITERS * s["offloaded_tensors"] > 0, s
        assert s["d2h_bytes"] == s["h2d_bytes"] == c["d2h_bytes"] > 0, (s, c)
        side = s["d2h_copies"] if overlap else 0
        assert s["d2h_side_stream_copies"] == s["h2d_side_stream_copies"] == side, s

    ranks = [st for st in read_stats(sim_stats).values() if st["rank"] is not None]
    assert len(ranks) == 2, ranks
    for st in ranks:
        assert not st["refusals"], st
        assert sum(op["calls"] for op in st["collectives"].values()) > 0, st
