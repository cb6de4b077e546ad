"""The ``mtmegatron`` console command: ``env`` reports this machine, ``patches`` explains every change."""

from __future__ import annotations

import subprocess
import sys

from mtmegatron import patches


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "mtmegatron.cli", *args], capture_output=True, text=True,
                          timeout=120)


def test_env_reports_backends_and_selection():
    proc = _cli("env")
    assert proc.returncode == 0, proc.stderr
    assert "cpu   device=cpu" in proc.stdout and "available" in proc.stdout
    assert "musa requested" not in proc.stdout  # reasons are stated plainly, not as errors
    assert "torch_musa is not installed" in proc.stdout
    assert "selected: cpu by auto-detect (collectives: gloo); passed over musa, cuda (reasons above)" in proc.stdout
    assert "native kernels on cpu: yes (mtmegatron._C)" in proc.stdout


def test_patches_lists_every_patch_with_target_and_reason():
    proc = _cli("patches", "--backend", "cpu")
    assert proc.returncode == 0, proc.stderr
    version = patches.megatron_version()
    for patch in patches.all_patches():
        mark = "applies" if patch.applies(version, "cpu") else "skipped"
        assert f"- {patch.name} [{mark};" in proc.stdout
        assert f"target: {patch.target}" in proc.stdout


def test_unavailable_backend_is_a_clear_error():
    proc = _cli("patches", "--backend", "musa")
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("mtmegatron: error: musa requested but torch_musa is not installed "
                                   "(install Moore Threads' torch_musa wheel matching your torch: 2.11.0.post1 "
                                   "for torch 2.11, 2.9.x for torch 2.9, 2.7.1 for torch 2.7.1)")


def test_help_description_is_whole():
    """``--help`` gives the module docstring's whole first paragraph (it once ended mid-sentence), re-flowed."""
    proc = _cli("--help")
    assert proc.returncode == 0, proc.stderr
    described = " ".join(proc.stdout.split("positional arguments")[0].split())
    assert "``patches`` (what is changed in megatron-core and why)" in described
    assert described.endswith("Training itself is ``torchrun -m mtmegatron.pretrain``.")
    assert "May assume" not in proc.stdout
