"""The streaming converter (convert/streaming.py) on a synthetic Llama-shaped bf16 checkpoint (hidden 1536, 4 layers:
324 MB) whose total size is >= 8x its largest tensor (the fused SwiGLU fc1, 36 MiB), converted with 2 workers:
* every worker's peak RSS (VmHWM from /proc/self/status, reported by the worker) grows by less than 2 x the largest
  tensor + 48 MB over its VmHWM before it read any tensor (a converter that materialised the model would need
  the whole checkpoint; torch's own DCP FileSystemWriter, which keeps the written chunks of its file, peaked at
  about 3.5x and fails it);
* the output has the finished marker, bf16 tensors (source dtype kept), and the same keys/shapes/chunks as
  megatron-core's own save; the HF parity tests (test_hf_parity.py, test_hf_families.py) load the streamed output
  under TP1/TP2/EP2 and match HF's logits;
* a conversion killed mid-write (``kill -9``) leaves no output and no finished marker, and its workers, stopped so that
  they cannot notice by themselves, are ended by the kernel within seconds; a rerun succeeds;
* a converted tiny HF Llama loads into ``pretrain`` under TP2 x PP2 with the TP1 first-iteration loss.
The way back (convert/streaming_export.py), on the same synthetic checkpoint:
* ``mcore-to-hf --workers 2``: every worker's VmHWM grows by less than 2 x the largest tensor + 48 MB; the HF
  shards (64 MiB limit -> several files + index) hold every original tensor bit-exactly, in bf16;
* a killed ``mcore-to-hf`` leaves no output and no finished marker, and its stopped workers die with it (the
  rerun's clean-up of the debris is shared with hf-to-mcore and tested there);
* the TP2 x PP2 pretrain checkpoint (distributed optimizer's state in it) converts back with no flags, equal to
  megatron-core's own (in-memory, resharding) load of the same checkpoint.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from helpers.cli_subprocess import ENV, run_cli
from helpers.conversion_memory import hwm_within_bound
from helpers.hf_parity import HF_MODELS, save_reference

MARKER = "conversion_complete.json"
TRAIN = ["--backend", "cpu", "--mock-data", "--seq-length", "16", "--micro-batch-size", "1", "--global-batch-size",
         "4", "--train-iters", "1", "--lr", "1e-3", "--lr-decay-style", "constant", "--log-interval", "100"]


def _synthetic(directory: Path) -> dict:
    code = ("import sys; from mtmegatron.convert.synthetic import llama_shape_for, write_llama; "
            "c = llama_shape_for(324 * 10**6, hidden=1536); print(write_llama(sys.argv[1], c))")
    proc = subprocess.run([sys.executable, "-c", code, str(directory)], capture_output=True, text=True, env=ENV,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((directory / "config.json").read_text())


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    root = tmp_path_factory.mktemp("synthetic")
    config = _synthetic(root / "hf")
    run_cli("convert", "hf-to-mcore", "--model", "llama3", "--hf-dir", str(root / "hf"), "--out", str(root / "mcore"),
            "--workers", "2")
    return root, config


def _children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (the converter's forked workers)."""
    found = []
    for entry in (e for e in os.listdir("/proc") if e.isdigit()):
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(entry))
    return found


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _kill_converter_and_its_stopped_workers_die(proc) -> None:
    """``kill -9`` the converter while its workers are stopped (SIGSTOP: they cannot notice by themselves that the
    parent is gone); the kernel ends them (PR_SET_PDEATHSIG) within seconds."""
    deadline = time.time() + 60
    while not (workers := _children(proc.pid)) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.005)  # the shards exist before the workers are forked
    assert workers, "no worker to stop"
    for pid in workers:
        os.kill(pid, signal.SIGSTOP)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 5
    while time.time() < deadline and any(_running(pid) for pid in workers):
        time.sleep(0.05)
    left = [pid for pid in workers if _running(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"workers {left} outlived the killed converter"


def test_peak_rss_per_worker_is_bounded_by_the_largest_tensor(synthetic):
    root, _ = synthetic
    hwm_within_bound(json.loads((root / "mcore" / MARKER).read_text()), "hf-to-mcore")


def test_output_is_bf16_and_laid_out_as_megatron_core_saves_it(synthetic):
    from torch.distributed.checkpoint import FileSystemReader

    root, config = synthetic
    meta = FileSystemReader(str(root / "mcore" / "iter_0000000")).read_metadata()
    layers = config["num_hidden_layers"]
    qkv = meta.state_dict_metadata["decoder.layers.self_attention.linear_qkv.weight"]
    assert qkv.properties.dtype == torch.bfloat16
    assert tuple(qkv.size) == (layers, 1536 + 2 * config["num_key_value_heads"] * 64, 1536)
    assert sorted(tuple(c.offsets)[0] for c in qkv.chunks) == list(range(layers))
    fc1 = meta.state_dict_metadata["decoder.layers.mlp.linear_fc1.weight"]  # gate and up chunks (SwiGLU factory)
    assert tuple(fc1.size) == (layers, 2 * config["intermediate_size"], 1536) and len(fc1.chunks) == 2 * layers
    assert not list(root.glob("mcore.partial.*"))


def test_killed_conversion_leaves_nothing_finished_and_a_rerun_succeeds(synthetic, tmp_path):
    root, _ = synthetic
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "mtmegatron.cli", "convert", "hf-to-mcore", "--model", "llama3", "--hf-dir",
            str(root / "hf"), "--out", str(out), "--workers", "1"]
    proc = subprocess.Popen(argv, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:  # kill once the worker is writing tensors
        if any(p.stat().st_size > 2**20 for p in tmp_path.glob("out.partial.*/part0/*.distcp")):
            break
        time.sleep(0.2)
    assert proc.poll() is None, "the conversion finished before it could be killed"
    _kill_converter_and_its_stopped_workers_die(proc)
    assert not out.exists() and not list(tmp_path.rglob(MARKER))
    assert list(tmp_path.glob("out.partial.*"))  # the debris is only under the temporary name
    run_cli(*argv[3:])
    assert (out / MARKER).is_file() and not list(tmp_path.glob("out.partial.*"))  # the rerun removed the debris


def test_converted_llama_loads_under_tp2_pp2_with_the_tp1_loss_and_its_checkpoint_streams_back(tmp_path):
    """The TP2 x PP2 run also saves (with the distributed optimizer's state): ``mcore-to-hf`` of that training
    checkpoint, with no flags, equals megatron-core's own resharding load of it into a TP1 model."""
    from helpers.pretrain_runner import run_pretrain
    from torch.distributed.checkpoint import FileSystemReader

    from mtmegatron.convert.hf_io import HFCheckpoint

    save_reference("llama3", tmp_path / "hf")
    run_cli("convert", "hf-to-mcore", "--model", "llama3", "--hf-dir", str(tmp_path / "hf"), "--out",
            str(tmp_path / "mcore"))
    flags = shlex.split((tmp_path / "mcore" / "model_flags.txt").read_text()) + TRAIN + [
        "--load", str(tmp_path / "mcore")]
    _, single = run_pretrain(1, flags, tmp_path / "tp1")
    trained = tmp_path / "trained"
    _, layout = run_pretrain(4, flags + ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                                         "--use-distributed-optimizer", "--save", str(trained)], tmp_path / "tp2pp2")
    print(f"\nfirst-iteration loss TP1 {single[0]['loss']:.7f}, TP2xPP2 {layout[0]['loss']:.7f}")
    assert abs(single[0]["loss"] - layout[0]["loss"]) <= 1e-5 * abs(single[0]["loss"])

    iteration = int((trained / "latest_checkpointed_iteration.txt").read_text())
    stored = FileSystemReader(str(trained / f"iter_{iteration:07d}")).read_metadata()
    assert any("optimizer" in k for k in stored.state_dict_metadata)  # the distributed optimizer's state is there
    run_cli("convert", "mcore-to-hf", "--load", str(trained), "--out", str(tmp_path / "back"), "--workers", "2")
    code = ("import sys, torch; from mtmegatron.convert.model import *; from mtmegatron.convert.mapping import "
            "hf_groups; from mtmegatron.convert.recorded_flags import flags_from_fingerprint; "
            "from mtmegatron.training.checkpoint.megatron_lm_checkpoint import recorded_fingerprint; "
            "args = parse_flags(flags_from_fingerprint(recorded_fingerprint(checkpoint_common(sys.argv[1])))); "
            "init_single_rank(args); m = build_model(args); load_model(m, sys.argv[1]); "
            "rows = ('embedding.word_embeddings.weight', 'output_layer.weight'); "
            "state = {k: v[:args.vocab_size] if k in rows else v for k, v in m.state_dict().items() "
            "if not k.endswith('_extra_state')}; "
            "out = {h: t.contiguous() for names, f in hf_groups(args.model, args) "
            "for h, t in f(*(state[n] for n in names)).items()}; torch.save(out, sys.argv[2])")
    proc = subprocess.run([sys.executable, "-c", code, str(trained), str(tmp_path / "ref.pt")],
                          capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reference, returned = torch.load(tmp_path / "ref.pt"), HFCheckpoint(str(tmp_path / "back"), dtype=None)
    assert sorted(reference) == returned.names
    assert all(torch.equal(reference[n], returned[n]) for n in returned.names)
    original = HFCheckpoint(str(tmp_path / "hf"))
    assert not torch.equal(returned["model.norm.weight"].float(), original["model.norm.weight"])  # it trained


def test_fp8_deepseek_streams_equal_to_its_bf16_dequantized_release(tmp_path):
    """A tiny DeepSeek-V3 in DeepSeek's FP8 release layout converts (streaming, 2 workers) to exactly the
    checkpoint its bf16 dequantized copy converts to (hf_models.fp8_release writes both; bf16 kept as bf16)."""
    from torch.distributed.checkpoint import FileSystemReader

    save_reference("deepseek-v3", tmp_path / "src")
    proc = subprocess.run([sys.executable, str(HF_MODELS), "--fp8", str(tmp_path / "src"),
                           str(tmp_path / "fp8"), str(tmp_path / "bf16")], capture_output=True, text=True, env=ENV,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for kind in ("fp8", "bf16"):
        run_cli("convert", "hf-to-mcore", "--model", "deepseek-v3", "--hf-dir", str(tmp_path / kind), "--out",
                str(tmp_path / f"mcore-{kind}"), "--workers", "2")
    code = ("import sys, torch; from mtmegatron.convert.model import parse_flags, init_single_rank, build_model, "
            "load_model; import shlex; a, b = sys.argv[1:3]; "
            "args = parse_flags(shlex.split(open(a + '/model_flags.txt').read()) + ['--bf16']); init_single_rank(args); "
            "m1 = build_model(args); load_model(m1, a); m2 = build_model(args); load_model(m2, b); "
            "s1, s2 = m1.state_dict(), m2.state_dict(); keys = [k for k in s1 if not k.endswith('_extra_state')]; "
            "bad = [k for k in keys if not torch.equal(s1[k], s2[k])]; print(len(keys), bad); assert not bad")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "mcore-fp8"), str(tmp_path / "mcore-bf16")],
                          capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    meta = FileSystemReader(str(tmp_path / "mcore-fp8" / "iter_0000000")).read_metadata()
    q_up = [md for key, md in meta.state_dict_metadata.items() if key.endswith("linear_q_up_proj.weight")]
    assert q_up and all(md.properties.dtype == torch.bfloat16 for md in q_up)  # FP8 -> bf16, not widened to fp32


def test_mcore_to_hf_streams_in_bounded_memory_and_gives_every_tensor_back(synthetic):
    from mtmegatron.convert.hf_io import HFCheckpoint

    root, _ = synthetic
    back = root / "back"
    run_cli("convert", "mcore-to-hf", "--load", str(root / "mcore"), "--out", str(back), "--workers", "2",
            "--max-shard-mb", "64")
    hwm_within_bound(json.loads((back / MARKER).read_text()), "mcore-to-hf")
    assert len(list(back.glob("model-*-of-*.safetensors"))) >= 3 and (back / "model.safetensors.index.json").is_file()
    original, returned = HFCheckpoint(str(root / "hf"), dtype=None), HFCheckpoint(str(back), dtype=None)
    assert original.names == returned.names
    for name in original.names:
        ours = returned[name]
        assert ours.dtype == torch.bfloat16 and torch.equal(original[name], ours), name
    assert not list(root.glob("back.partial.*"))


def test_killed_mcore_to_hf_leaves_nothing_finished(synthetic, tmp_path):
    root, _ = synthetic
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "mtmegatron.cli", "convert", "mcore-to-hf", "--load", str(root / "mcore"), "--out",
            str(out), "--workers", "1"]
    proc = subprocess.Popen(argv, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:  # kill once a worker is writing (the shards are sparse
        if sum(p.stat().st_blocks * 512 for p in tmp_path.glob("out.partial.*/*.safetensors")) > 2**20:  # before)
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the conversion finished before it could be killed"
    _kill_converter_and_its_stopped_workers_die(proc)
    assert not out.exists() and not list(tmp_path.rglob(MARKER))
    assert list(tmp_path.glob("out.partial.*"))  # the debris is only under the temporary name


def test_a_transform_returning_a_view_into_a_stacked_tensor_streams_its_own_rows():
    """A map transform may return ``stacked[e]`` (a view at a non-zero storage offset, as one expert of HF's
    stacked experts is); every chunk of it is that view's rows, not the stacked tensor's first rows."""
    from mtmegatron.convert.streaming import Chunk, _Sources

    stacked = torch.arange(24.0).reshape(3, 4, 2)
    sources = object.__new__(_Sources)
    sources.hf, sources.dtype, sources._name, sources._tensor = {"experts": stacked}, None, None, None
    sources.sources = {"expert2": (["experts"], lambda t: t[2])}
    sources.shapes = {"expert2": (4, 2)}
    sources._whole_input = lambda c: None
    second_half = Chunk(key="k", global_shape=(4, 2), offset=(2, 0), local="expert2", storage_offset=4, shape=(2, 2),
                        stride=(2, 1), prepend=0)
    assert torch.equal(sources.chunk(second_half), stacked[2, 2:])
