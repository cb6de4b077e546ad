"""Bad input to the tools is one line on stderr and exit status 2: ``mtmegatron convert`` (hf-to-mcore and
mcore-to-hf), ``preprocess``, ``generate``, and the flag parsers (a flag with a CRLF script's carriage return,
several flags in one quoted argument). For every case the whole of stderr is that one line, naming the file, flag
or record and why; nothing half-written stays behind (no ``<out>``, no ``<out>.partial.*``, no dataset files).

The convert cases need a one-rank process group and worker processes, so they run in one subprocess: this file
run as a script makes the inputs, calls ``mtmegatron.cli.main`` for each case with file descriptor 2 on a file,
and writes every case's status and stderr as JSON. Its first case fails after megatron-core is imported, so it is
also the check that no import notice comes before the line. A full disk is a 2 MiB tmpfs where this process may
mount one (root), else an injected ENOSPC. preprocess, generate and the flag parsers run in this process.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TINY = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_act="silu", hidden_size=64,
            intermediate_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=32, num_hidden_layers=2,
            vocab_size=256, max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0,
            tie_word_embeddings=False, torch_dtype="bfloat16")
BIG = {**TINY, "hidden_size": 256, "intermediate_size": 1024, "num_attention_heads": 4, "head_dim": 64}  # ~4 MB
SHARD2 = "model-00002-of-00003.safetensors"
Q0 = "model.layers.0.self_attn.q_proj.weight"


# ---- convert: each case changes a copy of a tiny HF checkpoint (hf) or names its own --load --------------------
def _edit_json(path: Path, change) -> None:
    value = json.loads(path.read_text())
    change(value)
    path.write_text(json.dumps(value))


def _wrong_q_shape(hf: Path) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(hf / SHARD2))
    tensors[Q0] = tensors[Q0][:48]  # 48 rows: not heads x head_dim, and not divisible into them
    save_file(tensors, str(hf / SHARD2), metadata={"format": "pt"})


def _broken_header(hf: Path) -> None:
    data = bytearray((hf / SHARD2).read_bytes())
    data[8:40] = b"#" * 32
    (hf / SHARD2).write_bytes(bytes(data))


def _not_a_checkpoint(load: Path) -> None:
    (load / "iter_0000000").mkdir(parents=True)
    (load / "latest_checkpointed_iteration.txt").write_text("0")
    (load / "iter_0000000" / "metadata.json").write_text('{"sharded_backend": "torch_dist", '
                                                          '"sharded_backend_version": 1, "common_backend": "torch", '
                                                          '"common_backend_version": 1}')
    (load / "iter_0000000" / "common.pt").write_bytes(b"not a torch file")


HF_TO_MCORE = ["convert", "hf-to-mcore", "--model", "llama3", "--hf-dir", "{hf}", "--out", "{out}"]
MCORE_TO_HF = ["convert", "mcore-to-hf", "--load", "{load}", "--out", "{out}"]
# name: (change to the input, argv, the expected line (after "mtmegatron: error: "), formatted with the paths)
CONVERT = {
    "config_disagrees_with_weights": (lambda hf: _edit_json(hf / "config.json", lambda c: c.update(
        intermediate_size=96)), HF_TO_MCORE, "the checkpoint gives shape (256, 64), the model built from config.json "
        "has (192, 64) (config and weights disagree)"),
    "hf_dir_missing": (lambda hf: shutil.rmtree(hf), HF_TO_MCORE, "--hf-dir {hf}: no such directory"),
    "config_missing": (lambda hf: (hf / "config.json").unlink(), HF_TO_MCORE, "--hf-dir {hf}: no config.json"),
    "config_not_json": (lambda hf: (hf / "config.json").write_text('{"model_type": "llama",'), HF_TO_MCORE,
                        "{hf}/config.json: not valid JSON (line 1, column 24: Expecting property name enclosed in "
                        "double quotes)"),
    "config_field_missing": (lambda hf: _edit_json(hf / "config.json", lambda c: c.pop("hidden_size")), HF_TO_MCORE,
                             "{hf}/config.json: no field 'hidden_size', which a llama config has"),
    "index_not_json": (lambda hf: (hf / "model.safetensors.index.json").write_text("{"), HF_TO_MCORE,
                       "{hf}/model.safetensors.index.json: not valid JSON"),
    "shard_missing": (lambda hf: (hf / SHARD2).unlink(), HF_TO_MCORE,
                      f"{{hf}}/model.safetensors.index.json lists {SHARD2}, which is not in {{hf}}"),
    "shard_truncated": (lambda hf: os.truncate(hf / SHARD2, 1000), HF_TO_MCORE,
                        f"{{hf}}/{SHARD2}: not a readable safetensors file"),
    "header_broken": (_broken_header, HF_TO_MCORE, f"{{hf}}/{SHARD2}: not a readable safetensors file"),
    "index_names_the_wrong_shard": (lambda hf: _edit_json(hf / "model.safetensors.index.json", lambda i: i[
        "weight_map"].update({Q0: "model-00003-of-00003.safetensors"})), HF_TO_MCORE,
        f"{{hf}}/model.safetensors.index.json places {Q0} in model-00003-of-00003.safetensors, which has no such "
        f"tensor"),
    "tensor_cannot_be_reshaped": (_wrong_q_shape, HF_TO_MCORE, "decoder.layers.0.self_attention.linear_qkv.weight: the "
                                  f"checkpoint's {Q0} (48, 64)"),
    "layout_does_not_divide": (lambda hf: None, HF_TO_MCORE + ["--tensor-model-parallel-size", "3"],
                               "target layout TP3 PP1 EP1: --tensor-model-parallel-size 3 does not divide"),
    "full_disk_hf_to_mcore": ("full", ["convert", "hf-to-mcore", "--model", "llama3", "--hf-dir", "{big}", "--out",
                                       "{full}/out", "--workers", "2"], "no space left on the device writing "),
    "load_missing": (lambda hf: None, MCORE_TO_HF, "--load {load}: no such directory"),
    "load_not_a_checkpoint": ("load", MCORE_TO_HF, "--load {load}: {load}/iter_0000000 is not a readable "
                              "megatron-core checkpoint"),
    "full_disk_mcore_to_hf": ("full", ["convert", "mcore-to-hf", "--load", "{big_mcore}", "--out", "{full}/out",
                                       "--workers", "2"], "no space left on the device writing "),
}


def _mount_small_tmpfs(directory: Path) -> bool:
    directory.mkdir()
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(directory)],
                          capture_output=True).returncode == 0


def _inject_full_disk():
    """No tmpfs: every write of a tensor (torch.save, os.pwrite) fails with ENOSPC; returns the undo."""
    import torch

    saved = torch.save, os.pwrite

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "<injected>")

    torch.save, os.pwrite = full, full
    return lambda: (setattr(torch, "save", saved[0]), setattr(os, "pwrite", saved[1]))


def _run_case(argv: list[str]) -> tuple[int, str]:
    """``mtmegatron.cli.main(argv)`` with file descriptor 2 (this process's and its workers') on a file."""
    import tempfile
    import traceback

    from mtmegatron import cli

    with tempfile.TemporaryFile() as err:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(err.fileno(), 2)
        try:
            status = cli.main(argv)
        except SystemExit as e:
            status = e.code
        except Exception:  # a traceback is a failed case, not a failed run of the table
            traceback.print_exc()
            status = 1
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        err.seek(0)
        return status, err.read().decode(errors="replace")


def _end_process_group() -> None:
    import torch

    if torch.distributed.is_initialized():
        from megatron.core import parallel_state

        parallel_state.destroy_model_parallel()
        torch.distributed.destroy_process_group()


def run_convert_cases(work: Path) -> dict:
    """Every CONVERT case in this process; {name: {status, stderr, paths, left behind}} (also the full disk kind)."""
    from mtmegatron.convert.synthetic import write_llama

    write_llama(str(work / "tiny"), TINY)
    write_llama(str(work / "big"), BIG)
    full = work / "full"
    mounted = _mount_small_tmpfs(full)
    results = {"_full_disk": "tmpfs" if mounted else "injected ENOSPC"}
    try:
        for name, (change, argv, expected) in CONVERT.items():
            case = work / name
            case.mkdir()
            paths = {"hf": case / "hf", "out": case / "out", "load": case / "load", "big": work / "big",
                     "big_mcore": work / "big_mcore", "full": full}
            shutil.copytree(work / "tiny", paths["hf"])
            undo = None
            if change == "load":
                _not_a_checkpoint(paths["load"])
            elif change == "full":
                if "{big_mcore}" in argv and not paths["big_mcore"].exists():  # after the first case (see above)
                    status, err = _run_case(["convert", "hf-to-mcore", "--model", "llama3", "--hf-dir",
                                             str(paths["big"]), "--out", str(paths["big_mcore"])])
                    _end_process_group()
                    assert status == 0, err
                undo = None if mounted else _inject_full_disk()
            else:
                change(paths["hf"])
            try:
                status, err = _run_case([a.format(**paths) for a in argv])
            finally:
                if undo:
                    undo()
                _end_process_group()
            out = Path(argv[argv.index("--out") + 1].format(**paths))
            left = sorted(str(p) for p in out.parent.iterdir() if p.name.startswith(out.name))
            results[name] = {"status": status, "stderr": err, "expected": expected.format(**paths), "left": left}
    finally:
        if mounted:
            subprocess.run(["umount", str(full)], check=False)
    return results


@pytest.fixture(scope="module")
def convert_results(tmp_path_factory):
    work = tmp_path_factory.mktemp("convert_cases")
    proc = subprocess.run([sys.executable, __file__, str(work)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    results = json.loads((work / "results.json").read_text())
    print(f"\nfull disk: {results.pop('_full_disk')}")
    return results


def _assert_one_line(status, err: str, prefix: str, expected: str) -> None:
    assert status == 2, err
    assert err.endswith("\n") and err.count("\n") == 1, err  # the whole of stderr: one line
    assert err.startswith(prefix) and expected in err, err


@pytest.mark.parametrize("case", list(CONVERT))
def test_convert(convert_results, case):
    result = convert_results[case]
    _assert_one_line(result["status"], result["stderr"], "mtmegatron: error: ", result["expected"])
    assert result["left"] == [], result["left"]  # neither <out> nor <out>.partial.<pid>


# ---- preprocess, generate, flags: in this process ------------------------------------------------------------
def _cli(capfd, *argv: str) -> tuple[int, str]:
    from mtmegatron import cli

    capfd.readouterr()
    try:
        status = cli.main(list(argv))
    except SystemExit as e:
        status = e.code
    return status, capfd.readouterr().err


def _gz(path: Path, data: bytes) -> None:
    import gzip

    path.write_bytes(gzip.compress(data))


DOC = b'{"text": "1 2 3"}\n'  # NullTokenizer's documents are token ids
PREPROCESS = {  # name: (input file name, its bytes or writer, extra flags, expected line)
    "input_missing": ("absent.jsonl", None, [], "no such input file: {input}"),
    "not_utf8": ("a.jsonl", DOC + b'{"text": "4 5 \xe9"}\n', [], "{input}:2: not UTF-8 text"),
    "not_json": ("a.jsonl", DOC + b'{"body": 1}\n', [], "{input}:2: not a JSON object with a 'text' field"),
    "text_not_a_string": ("a.jsonl", DOC + b'{"text": [1, 2]}\n', [], "{input}:2: field 'text' is a list, not text"),
    "not_tokenizable": ("a.jsonl", DOC + b'{"text": "some words"}\n', ["--workers", "2"],
                        "{input}: document 2 ('text') cannot be tokenized: invalid literal for int()"),
    "gzip_not_gzip": ("a.jsonl.gz", DOC, [], "{input}: not a whole gz file"),
    "gzip_truncated": ("a.jsonl.gz", lambda p: (_gz(p, DOC * 2000), os.truncate(p, p.stat().st_size // 2)),
                       ["--workers", "2"],
                       "{input}: not a whole gz file (Compressed file ended before the end-of-stream marker"),
    "tokenizer_missing": ("a.jsonl", DOC, ["--tokenizer-model", "{tmp}/no_tokenizer"],
                          "no tokenizer at {tmp}/no_tokenizer"),
    "output_under_a_file": ("a.jsonl", DOC, ["--output-prefix", "{input}/x/out"],
                            "--output-prefix {input}/x/out: {input} is a file, not a directory"),
}


@pytest.mark.parametrize("case", list(PREPROCESS))
def test_preprocess(capfd, tmp_path, case):
    name, content, extra, expected = PREPROCESS[case]
    path = tmp_path / name
    if callable(content):
        content(path)
    elif content is not None:
        path.write_bytes(content)
    fill = {"input": path, "tmp": tmp_path}
    extra = [a.format(**fill) for a in extra]
    tokenizer = [] if "--tokenizer-model" in extra else ["--tokenizer-type", "NullTokenizer", "--vocab-size", "300"]
    prefix = [] if "--output-prefix" in extra else ["--output-prefix", str(tmp_path / "out")]
    workers = [] if "--workers" in extra else ["--workers", "1"]
    status, err = _cli(capfd, "preprocess", "--input", str(path), *prefix, *tokenizer, *workers, *extra)
    _assert_one_line(status, err, "mtmegatron preprocess: error: ", expected.format(**fill))
    assert sorted(p.name for p in tmp_path.iterdir()) == ([name] if content is not None else [])


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    from mtmegatron.data.tokenizer import train_bpe

    directory = tmp_path_factory.mktemp("tok") / "tok"
    train_bpe(["the quick brown fox jumps over the lazy dog"] * 20, 270, str(directory))
    return directory


GENERATE = {  # name: (--load, prompt flags, expected line)
    "load_missing": ("{tmp}/absent", ["--prompt", "Hi"], "--load {tmp}/absent: no such directory"),
    "load_not_a_checkpoint": ("{tmp}/load", ["--prompt", "Hi"],
                              "--load {tmp}/load: {tmp}/load/iter_0000000 is not a readable megatron-core checkpoint"),
    "prompts_not_utf8": ("{tmp}/absent", ["--prompts-file", "{tmp}/prompts.txt"],
                         "--prompts-file {tmp}/prompts.txt: not UTF-8 text"),
    "prompts_file_missing": ("{tmp}/absent", ["--prompts-file", "{tmp}/nothing.txt"],
                             "--prompts-file {tmp}/nothing.txt: No such file or directory"),
    "tokenizer_missing": ("{tmp}/absent", ["--prompt", "Hi", "--tokenizer-model", "{tmp}/no_tokenizer"],
                          "no tokenizer at {tmp}/no_tokenizer"),
}


@pytest.mark.parametrize("case", list(GENERATE))
def test_generate(capfd, tmp_path, tokenizer_dir, case):
    load, flags, expected = GENERATE[case]
    _not_a_checkpoint(tmp_path / "load")
    (tmp_path / "prompts.txt").write_bytes(b"Hello\n\xff\xfe\n")
    flags = [a.format(tmp=tmp_path) for a in flags]
    tokenizer = [] if "--tokenizer-model" in flags else ["--tokenizer-model", str(tokenizer_dir)]
    status, err = _cli(capfd, "generate", "--backend", "cpu", "--load", load.format(tmp=tmp_path), *tokenizer, *flags)
    _assert_one_line(status, err, "mtmegatron generate: error: ", expected.format(tmp=tmp_path))


CRLF = "flag '--sequence-parallel\\r' ends in a carriage return: the script has Windows line endings (CRLF); run " \
       "dos2unix on it"
SEVERAL = "'--sequence-parallel --bf16' is several flags in one argument: unquote it"
FLAGS = {  # name: (the command: pretrain or the mtmegatron CLI, argv, expected line)
    "pretrain_crlf": ("pretrain", ["--backend", "cpu", "--mock-data", "--sequence-parallel\r"],
                      "mtmegatron.pretrain: error: " + CRLF),
    "pretrain_several_in_one": ("pretrain", ["--backend", "cpu", "--mock-data", "--sequence-parallel --bf16"],
                                "mtmegatron.pretrain: error: " + SEVERAL),
    "pretrain_typo": ("pretrain", ["--backend", "cpu", "--trian-iters", "3"],
                      "mtmegatron.pretrain: error: unknown flag --trian-iters (did you mean --train-iters?)"),
    "convert_crlf": ("cli", ["convert", "hf-to-mcore", "--model", "llama3", "--hf-dir", "h", "--out", "o",
                             "--sequence-parallel\r"], "mtmegatron convert hf-to-mcore: error: " + CRLF),
    "convert_missing_flag": ("cli", ["convert", "hf-to-mcore", "--model", "llama3", "--out", "o"],
                             "mtmegatron convert hf-to-mcore: error: the following arguments are required: --hf-dir"),
    "preprocess_several_in_one": ("cli", ["preprocess", "--input", "x", "--output-prefix", "y",
                                          "--sequence-parallel --bf16"], "mtmegatron preprocess: error: " + SEVERAL),
}


@pytest.mark.parametrize("case", list(FLAGS))
def test_flags(capfd, case):
    command, argv, expected = FLAGS[case]
    if command == "pretrain":
        from mtmegatron import pretrain

        capfd.readouterr()
        with pytest.raises(SystemExit) as exit_:
            pretrain.main(argv)
        status, err = exit_.value.code, capfd.readouterr().err
    else:
        status, err = _cli(capfd, *argv)
    _assert_one_line(status, err, expected.split(": error: ")[0], expected)


if __name__ == "__main__":
    work = Path(sys.argv[1])
    (work / "results.json").write_text(json.dumps(run_convert_cases(work)))
