"""The CPU kernel cores are compiled per ISA (base, AVX2, AVX-512) with explicit vector code for fp32/bf16.
Each variant, forced with MTMEGATRON_CPU_ISA in a fresh process, must (a) round fp32 -> bf16 exactly like
PyTorch (nearest even, NaN stays NaN): swiglu on bf16 input equals swiglu on the same values in fp32 rounded by
torch, bit for bit, over widths that exercise every vector tail; (b) match the references for softmax (masked,
causal), cross-entropy, rms_norm, MoE unpermute and adam at tail-heavy shapes."""
import json
import os
import subprocess
import sys

import pytest

_CHILD = r"""
import json, torch
from mtmegatron import ops
from mtmegatron.ops import activation, cross_entropy, moe, norm, softmax, adam
out = {"isa": ops.BUILD_INFO.get("cpu_isa")}
g = torch.Generator().manual_seed(0)
bad = []
for n in list(range(1, 40)) + [255, 4097]:
    x = (torch.randn(3, 2 * n, generator=g) * 4)
    x[0, 0] = float("nan"); x[1, -1] = float("inf")
    xb = x.bfloat16()
    got = activation.swiglu_op(xb)
    want = activation.swiglu_op(xb.float()).bfloat16()
    if not torch.equal(got.view(torch.int16), want.view(torch.int16)):
        bad.append(("swiglu", n))
def close(name, a, b, rtol, atol):
    if not torch.allclose(a.float(), b.float(), rtol=rtol, atol=atol, equal_nan=True):
        bad.append((name, float((a.float() - b.float()).abs().max())))
for dt, rtol, atol in ((torch.float32, 1e-5, 1e-6), (torch.bfloat16, 2**-7, 1e-2)):
    for sk in (5, 17, 33):
        x = torch.randn(2, 3, 7, sk, generator=g).to(dt)
        m = torch.rand(2, 1, 7, sk, generator=g) > 0.7
        close(f"masked_softmax {dt} {sk}", softmax.scaled_masked_softmax_op(x, m, 0.3),
              softmax.scaled_masked_softmax_reference(x, m, 0.3), rtol, atol)
        gy = torch.randn(2, 3, 7, sk, generator=g).to(dt)
        y = softmax.scaled_masked_softmax_op(x, m, 0.3)
        close(f"masked_softmax_bwd {dt} {sk}", softmax.scaled_masked_softmax_backward_op(gy, y, m, 0.3),
              softmax.scaled_masked_softmax_backward_reference(gy, y, m, 0.3), rtol, atol)
        xc = torch.randn(4, sk, sk, generator=g).to(dt)
        close(f"causal_softmax {dt} {sk}", softmax.scaled_upper_triang_masked_softmax_op(xc, 0.5),
              softmax.scaled_upper_triang_masked_softmax_reference(xc, 0.5), rtol, atol)
        lg = (torch.randn(6, sk * 3, generator=g) * 3).to(dt)
        t = torch.randint(0, sk * 3, (6,), generator=g)
        for a, b in zip(cross_entropy.cross_entropy_op(lg, t, -100), cross_entropy.cross_entropy_reference(lg, t, -100)):
            close(f"cross_entropy {dt} {sk}", a, b, 1e-5, 1e-5)
        xn, w = torch.randn(5, sk * 3, generator=g).to(dt), torch.randn(sk * 3, generator=g).to(dt)
        for a, b in zip(norm.rms_norm_op(xn, w, 1e-5), norm.rms_norm_reference(xn, w, 1e-5)):
            close(f"rms_norm {dt} {sk}", a, b, rtol, atol)
    for hidden in (5, 37):
        rmap = torch.rand(9, 4, generator=g) > 0.5
        _, row_id_map = moe.moe_permute_index_op(rmap)
        perm = torch.randn(int(rmap.sum()), hidden, generator=g).to(dt)
        pr = torch.rand(9, 4, generator=g)
        close(f"unpermute {dt} {hidden}", moe.moe_unpermute_op(perm, row_id_map, pr),
              moe.moe_unpermute_reference(perm, row_id_map, pr), rtol, atol)
p = [torch.randn(n, generator=g) for n in (1, 13, 1000)]
gr = [torch.randn_like(t) for t in p]
m, v = [torch.rand_like(t) for t in p], [torch.rand_like(t) for t in p]
p2, m2, v2 = [t.clone() for t in p], [t.clone() for t in m], [t.clone() for t in v]
adam.adam_step_op(p, gr, m, v, 1e-2, 0.9, 0.95, 1e-8, 0.1, 3)
adam.adam_step_reference(p2, gr, m2, v2, 1e-2, 0.9, 0.95, 1e-8, 0.1, 3)
for a, b in zip(p + m + v, p2 + m2 + v2):
    close("adam", a, b, 1e-5, 1e-6)
out["bad"] = bad
print(json.dumps(out))
"""


@pytest.mark.parametrize("isa", ["base", "avx2", "native"])
def test_isa_variant_matches_reference(isa):
    env = dict(os.environ, OMP_NUM_THREADS="2")
    if isa != "native":
        env["MTMEGATRON_CPU_ISA"] = isa
    proc = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if isa != "native":
        assert result["isa"] in (isa, "base"), result  # base where the machine lacks the asked-for level
    assert result["bad"] == [], result
