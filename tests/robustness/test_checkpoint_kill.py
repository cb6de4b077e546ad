"""No checkpoint is lost or silently ignored: kill -9 inside each kind of save, resume, and a full disk.

Three 2-rank runs (DP2, distributed optimizer; non-persistent saves every 2 iterations, persistent at 6), shared
by the tests (module fixture):
- ``killed``: rank 1 is killed (SIGKILL) inside the non-persistent save of 4 (its shard written, the save not yet
  complete): the non-persistent checkpoint of 2 must still be there and tracked;
- ``resumed``: ``--load`` of that directory continues at 2 (iterations 3, 4 equal the killed run's, which ran
  them uninterrupted from scratch), saves the non-persistent checkpoint of 4 (2 removed only then) and is killed
  inside the persistent save of 6;
- ``full``: ``--load`` of the same directory continues from the newest complete checkpoint, the non-persistent
  one of 4 (iterations 5, 6 equal the resumed run's, which ran them uninterrupted since 2), and saves 6 into a
  ``--save`` directory on a full disk that holds a copy of checkpoint 4: one line naming the directory and its
  free space, exit 2, the ``.partial`` removed and 4 still the latest. The full disk is a tmpfs sized for one and
  a half checkpoints where this process may mount one (root), else ENOSPC injected into rank 0's save
  (``MTMEGATRON_TEST_ENOSPC_IN_SAVE``); the fixture prints which.
The refusals of a tracker naming a missing checkpoint (persistent and non-persistent) are checked in-process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers.launch import finish, launch, wait_for
from helpers.pretrain_runner import TINY, run_pretrain
from mtmegatron.utils.checkpoint_dirs import TRACKER, CheckpointError, check_load, resume_point
from mtmegatron.utils.errors import ConfigError

FLAGS = TINY + ["--use-distributed-optimizer", "--train-iters", "6", "--save-interval", "6",
                "--non-persistent-save-interval", "2", "--non-persistent-ckpt-type", "global"]
PAUSE = "MTMEGATRON_TEST_PAUSE_IN_SAVE"


def _losses(log_dir: Path) -> dict[int, float]:
    metrics = log_dir / "metrics.jsonl"
    return {r["iteration"]: r["loss"] for r in map(json.loads, metrics.read_text().splitlines())}


def _kill_in_save(args: list[str], log_dir: Path, marker: Path, iteration: int) -> tuple[int, str]:
    """Run until rank 1 pauses inside the save of ``iteration`` (``marker`` names its pid), then SIGKILL it."""
    proc = launch(2, args, log_dir, {PAUSE: f"{iteration}:1"})
    wait_for(marker.exists, proc, what=f"rank 1 to pause inside the save of iteration {iteration}")
    os.kill(int(wait_for(lambda: marker.read_text().strip(), proc, what="pid")), signal.SIGKILL)
    out, _ = finish(proc)
    return proc.returncode, out


def _size_on_disk(directory: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in directory.rglob("*") if p.is_file())


def _full_disk(directory: Path, size: int) -> bool:
    """A tmpfs of ``size`` bytes at ``directory`` when this process may mount one."""
    directory.mkdir()
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)],
                          capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ckpt_kill")
    ckpt = tmp / "ckpt"
    non_persistent = ckpt / "non_persistent"
    killed_rc, _ = _kill_in_save(FLAGS + ["--save", str(ckpt)], tmp / "killed", non_persistent / "paused-rank1", 4)
    after_kill = {"listing": sorted(p.name for p in non_persistent.iterdir()),
                  "tracker": (non_persistent / TRACKER).read_text()}
    resumed_rc, resumed_out = _kill_in_save(FLAGS + ["--save", str(ckpt), "--load", str(ckpt)], tmp / "resumed",
                                            ckpt / "paused-rank1", 6)
    after_second_kill = {"listing": sorted(p.name for p in ckpt.iterdir()),
                         "non_persistent": sorted(p.name for p in non_persistent.iterdir())}
    # the full disk: room for one and a half checkpoints, one of them (a copy of 4) already there
    disk = tmp / "disk"
    mounted = _full_disk(disk, _size_on_disk(non_persistent / "iter_0000004") * 3 // 2)
    try:
        shutil.copytree(non_persistent / "iter_0000004", disk / "iter_0000004")
        (disk / TRACKER).write_text("4")
        full, _ = run_pretrain(2, FLAGS + ["--load", str(ckpt), "--save", str(disk)], tmp / "full", expect_ok=False,
                               env=None if mounted else {"MTMEGATRON_TEST_ENOSPC_IN_SAVE": "6"})
        on_disk = {"listing": sorted(p.name for p in disk.iterdir()), "tracker": (disk / TRACKER).read_text(),
                   "complete": (disk / "iter_0000004" / "metadata.json").is_file()}
    finally:
        if mounted:
            subprocess.run(["umount", str(disk)], check=False)
    print(f"\nfull disk: {'tmpfs' if mounted else 'injected ENOSPC'}")
    return {"ckpt": ckpt, "disk": disk, "killed_rc": killed_rc, "after_kill": after_kill, "resumed_rc": resumed_rc,
            "resumed_out": resumed_out, "after_second_kill": after_second_kill, "full": full, "on_disk": on_disk,
            "killed": _losses(tmp / "killed"), "resumed": _losses(tmp / "resumed"), "full_losses": _losses(tmp / "full")}


def test_kill_inside_a_non_persistent_save_keeps_the_previous_one(runs):
    assert runs["killed_rc"] != 0
    assert sorted(runs["killed"]) == [1, 2, 3, 4]  # iteration 4 was logged, then its save was interrupted
    # the newest complete non-persistent checkpoint stays (tracked) until the next one is complete
    assert runs["after_kill"] == {"listing": ["iter_0000002", "iter_0000004.partial", TRACKER, "paused-rank1"],
                                  "tracker": "2"}


def test_resume_after_the_non_persistent_kill_continues_the_run(runs):
    out = runs["resumed_out"]
    assert f"the non-persistent checkpoint in {runs['ckpt'] / 'non_persistent'} is the newest" in out, out[-3000:]
    assert "continuing at iteration 2" in out
    resumed, killed = runs["resumed"], runs["killed"]
    assert sorted(resumed) == [3, 4, 5, 6]
    assert [resumed[i] for i in (3, 4)] == [killed[i] for i in (3, 4)]  # weights and Adam's moments restored


def test_kill_inside_a_persistent_save_then_resume_from_the_newest_complete(runs):
    assert runs["resumed_rc"] != 0
    # the persistent save of 6 never completed; the non-persistent 4 replaced 2 once it was complete and tracked
    assert runs["after_second_kill"] == {"listing": ["iter_0000006.partial", "non_persistent", "paused-rank1"],
                                         "non_persistent": ["iter_0000004", TRACKER, "paused-rank1"]}
    full = runs["full"]
    assert "continuing at iteration 4" in full.stdout, full.stdout[-3000:] + full.stderr[-3000:]
    assert sorted(runs["full_losses"]) == [5, 6]
    assert [runs["full_losses"][i] for i in (5, 6)] == [runs["resumed"][i] for i in (5, 6)]


def test_a_full_disk_is_one_line_and_corrupts_nothing(runs):
    full, disk = runs["full"], runs["disk"]
    assert full.returncode == 2, full.stderr[-3000:]
    errors = [line for line in full.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and "Traceback" not in full.stderr, full.stderr[-4000:]
    assert errors[0].startswith(f"mtmegatron.pretrain: error: --save {disk}: no space left on the device while "
                                f"saving a checkpoint ("), errors[0]
    assert " MiB free of " in errors[0] and "iteration 4 stays the latest checkpoint" in errors[0], errors[0]
    assert runs["on_disk"] == {"listing": ["iter_0000004", TRACKER], "tracker": "4", "complete": True}


def _args(tmp: Path, **kw) -> SimpleNamespace:
    return SimpleNamespace(**{"save": None, "finetune": False, "exit_on_missing_checkpoint": False,
                              "non_persistent_ckpt_type": None, "non_persistent_global_ckpt_dir": None, **kw})


def _complete(directory: Path) -> None:
    directory.mkdir(parents=True)
    (directory / "metadata.json").write_text("{}")


def test_a_tracker_naming_a_missing_checkpoint_is_refused_never_a_fresh_start(tmp_path):
    # the reported directory: the non-persistent tracker names 5, which is gone; 6 was never completed
    load = tmp_path / "ckpt"
    (load / "non_persistent" / "iter_0000006.partial").mkdir(parents=True)
    (load / "non_persistent" / TRACKER).write_text("5")
    glob = _args(tmp_path, non_persistent_ckpt_type="global")
    with pytest.raises(ConfigError, match=rf"^--load {load}: {load}/non_persistent/{TRACKER} names iteration 5 but "
                                          rf"{load}/non_persistent/iter_0000005 is missing; complete checkpoints: "
                                          rf"none \(remove "):
        check_load(str(load), glob, ConfigError)
    with pytest.raises(ConfigError, match=r"it holds non_persistent/iter_0000006.partial, non_persistent/latest"):
        check_load(str(load), _args(tmp_path), ConfigError)  # without the flag: debris, not a fresh start
    # a complete persistent checkpoint is listed (and not silently taken instead)
    _complete(load / "iter_0000004")
    with pytest.raises(CheckpointError, match=rf"complete checkpoints: {load}/iter_0000004 \(to resume from one"):
        resume_point(str(load), glob)
    # the same for a persistent tracker, listing the non-persistent checkpoints too
    (load / TRACKER).write_text("8")
    (load / "non_persistent" / TRACKER).unlink()
    _complete(load / "non_persistent" / "iter_0000003")
    with pytest.raises(ConfigError, match=rf"{TRACKER} names iteration 8 but {load}/iter_0000008 is missing; complete "
                                          rf"checkpoints: {load}/iter_0000004, {load}/non_persistent/iter_0000003 "):
        check_load(str(load), glob, ConfigError)
    (load / TRACKER).write_text("4")
    assert resume_point(str(load), glob) == (str(load), 4)
    _complete(load / "non_persistent" / "iter_0000004")  # a tie: the non-persistent one, as Megatron-LM
    assert resume_point(str(load), glob) == (str(load / "non_persistent"), 4)
    # only non-persistent checkpoints while the run does not read them: refused, not a fresh start
    only = tmp_path / "only"
    _complete(only / "non_persistent" / "iter_0000006")
    with pytest.raises(ConfigError, match=r"holds the non-persistent checkpoint of iteration 6: pass "
                                          r"--non-persistent-ckpt-type global"):
        check_load(str(only), _args(tmp_path), ConfigError)
    check_load(str(only), _args(tmp_path, non_persistent_ckpt_type="global"), ConfigError)


def test_prune_keeps_the_checkpoint_just_saved_and_the_save_dir_is_not_the_non_persistent_dir(tmp_path):
    from mtmegatron.training.checkpoint.checkpointing import prune
    from mtmegatron.config.resilience_flags import check_resilience_args

    for it in (2, 4, 50):  # 50: left by an abandoned run that went further
        _complete(tmp_path / f"iter_{it:07d}")
    (tmp_path / "iter_0000006.partial").mkdir()
    prune(str(tmp_path), 1, 4)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_0000004", "iter_0000050"]
    args = SimpleNamespace(rerun_mode="disabled", non_persistent_ckpt_type="global", non_persistent_save_interval=2,
                           save=str(tmp_path), non_persistent_global_ckpt_dir=str(tmp_path) + "/")
    with pytest.raises(ConfigError, match="is the --save directory: each non-persistent save keeps only the newest"):
        check_resilience_args(args)
