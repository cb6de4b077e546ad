"""The CUDA -> MUSA porting step: every CUDA source (and the GPU headers and the CUDA binding) has a MUSA
counterpart, nothing CUDA-only from the port table survives, and the committed kernels/musa/ is up to date."""
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
