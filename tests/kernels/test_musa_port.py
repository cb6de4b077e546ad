"""The CUDA -> MUSA porting step: every CUDA source (and the GPU headers and the CUDA binding) has a MUSA
counterpart, nothing CUDA-only from the port table survives, and the committed kernels/musa/ is up to date."""
import sys

from mtmegatron.ops import musa_port


def test_every_cuda_source_has_a_musa_source():
    outputs = musa_port.ported_sources()
    for cu in (musa_port.KERNELS / "cuda").glob("*.cu"):  # mtm: allow-cuda-name
        assert musa_port.MUSA_DIR / f"{cu.stem}.mu" in outputs
    assert musa_port.MUSA_DIR / "bind_musa.cpp" in outputs


def test_no_cuda_only_identifiers_left():
    for path, text in musa_port.ported_sources().items():
        assert musa_port.leftovers(text) == [], path.name


def test_port_rules_apply():
    src = (
        "#include <cuda_runtime.h>\ncudaStream_t s; c10::cuda::getCurrentCUDAStream(); __nv_bfloat16 x;\n"  # mtm: allow-cuda-name
        "TORCH_LIBRARY_IMPL(mtmegatron, CUDA, m) {}\nncclComm_t c;\n"  # mtm: allow-cuda-name
    )
    out = musa_port.port_text(src)
    for expected in ("musa_runtime.h", "musaStream_t", "c10::musa::getCurrentMUSAStream", "__mt_bfloat16",
                     "TORCH_LIBRARY_IMPL(mtmegatron, PrivateUse1, m)", "mcclComm_t"):
        assert expected in out
    assert musa_port.leftovers(out) == []


def test_committed_musa_sources_are_current():
    stale = [p.name for p, text in musa_port.ported_sources().items() if not p.exists() or p.read_text() != text]
    assert stale == [], "run: python -m mtmegatron.ops.musa_port"


# ---- warp size (MUSA mp_21/mp_22 warps have 128 lanes; UNVERIFIED on hardware) -----------------------------
import re  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402

import pytest  # noqa: E402

from mtmegatron.ops import musa_build  # noqa: E402

# Warp-width assumptions that must not appear in any ported source: a 32-slot reduction buffer, a literal
# shuffle mask, lane/warp arithmetic with 31 / 5, and 32-lane strides or launches.
_WARP_LITERALS = re.compile(
    r"red\[32\]|__shfl\w*_sync\(\s*0x|threadIdx\.x\s*&\s*31|threadIdx\.x\s*>>\s*5|\+=\s*32\b|<<<[^>]*,\s*32\s*[,>]"
)


def test_arch_to_warp_size():
    assert musa_port.warp_size_for_arch("22") == 128
    assert musa_port.warp_size_for_arch("mp_21") == 128
    assert musa_port.warp_size_for_arch(10) == 128
    assert musa_port.warp_size_for_arch("31") == 32
    assert musa_port.warp_size_for_arch_list("21;22") == 128
    assert musa_port.warp_size_for_arch_list("mp_31") == 32
    with pytest.raises(ValueError, match="mixes warp sizes"):
        musa_port.warp_size_for_arch_list("22;31")
    with pytest.raises(ValueError, match="empty"):
        musa_port.warp_size_for_arch_list("")
    with pytest.raises(ValueError, match="not a MUSA arch"):
        musa_port.warp_size_for_arch("sm_90")


def test_ported_sources_have_no_32_lane_assumptions():
    for path, text in musa_port.ported_sources().items():
        assert not _WARP_LITERALS.findall(text), (path.name, _WARP_LITERALS.findall(text))
    header = musa_port.ported_sources()[musa_port.MUSA_DIR / "include/mtm/musa_common.muh"]
    assert "#define MTM_WARP_SIZE 32" not in header, "the MUSA header must not default to 32 lanes"
    assert musa_port.MUSA_WARP_BLOCK in header
    assert "red[kMaxWarps]" in musa_port.ported_sources()[musa_port.MUSA_DIR / "rms_norm.mu"]


def test_the_detector_catches_32_lane_code():
    for bad in ("__shared__ float red[32];", "__shfl_xor_sync(0xffffffffu, v, o)", "int lane = threadIdx.x & 31;",
                "for (j = lane; j < n; j += 32)", "k<<<grid, 32, 0, s>>>(a);"):
        assert _WARP_LITERALS.search(bad), bad


def test_mp22_build_defines_warp_size_128(monkeypatch):
    """musa_build passes -DMTM_WARP_SIZE from TORCH_MUSA_ARCH_LIST (torch_musa's MUSAExtension is faked)."""
    seen = {}
    fake = type(sys)("torch_musa.utils.musa_extension")
    fake.MUSAExtension = lambda **kw: seen.update(kw) or kw
    monkeypatch.setitem(sys.modules, "torch_musa.utils.musa_extension", fake)
    musa_build.musa_extension("22")
    assert "-DMTM_WARP_SIZE=128" in seen["extra_compile_args"]["mcc"]
    assert seen["name"] == "mtmegatron._musa_kernels"
    musa_build.musa_extension("31")
    assert "-DMTM_WARP_SIZE=32" in seen["extra_compile_args"]["mcc"]


@pytest.mark.parametrize("arch,warp,ok", [(220, 128, True), (210, 128, True), (310, 32, True), (220, 32, False),
                                          (310, 128, False), (None, None, False)])
def test_musa_header_guard_rejects_a_wrong_warp_size(tmp_path, arch, warp, ok):
    """The ported header's guard, run through the C preprocessor: a warp size that does not match
    __MUSA_ARCH__ (or none at all) stops the build."""
    cpp = shutil.which("cpp") or shutil.which("g++")
    assert cpp, "a C preprocessor (cpp or g++) is needed"
    (tmp_path / "guard.h").write_text(musa_port.MUSA_WARP_BLOCK)
    defines = ([f"-D__MUSA_ARCH__={arch}"] if arch else []) + ([f"-DMTM_WARP_SIZE={warp}"] if warp else [])
    cmd = [cpp, "-E", "-x", "c++", *defines, str(tmp_path / "guard.h")]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert (proc.returncode == 0) == ok, proc.stderr


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed on this machine")
def test_cuda_sources_are_warp_size_generic(tmp_path):
    """The sources the port starts from compile with a 128-lane warp size too (compile-only: nothing about
    NVIDIA runs with 128; this checks every buffer and stride follows kWarpSize)."""
    failures = {}
    for name in ("softmax.cu", "rms_norm.cu", "moe.cu", "cross_entropy.cu"):
        src = musa_port.KERNELS / "cuda" / name  # mtm: allow-cuda-name
        cmd = ["nvcc", "-c", "-std=c++17", "-DMTM_WARP_SIZE=128", f"-I{musa_port.KERNELS / 'include'}",
               "-arch=sm_90", str(src), "-o", str(tmp_path / (name + ".o"))]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode:
            failures[name] = proc.stderr[-2000:]
    assert not failures, failures
