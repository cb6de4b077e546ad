// CUDA core of rotary position embedding on [s, b, h, d]: one thread per rotated pair, pass-through dims copied.
// Same pair index map as the CPU core (rotate-half, interleaved, MLA); backward applies the transpose.
#include "mtm/cuda_common.cuh"
#include "mtm/gpu.h"

namespace mtm {
namespace gpu {
namespace {

template <typename T>
__global__ void rope_kernel(RopeArgs a) {
  const T* t = static_cast<const T*>(a.t);
  const float* freqs = static_cast<const float*>(a.freqs);
  T* out = static_cast<T*>(a.out);
  const int64_t half = a.rot / 2, heads = a.s * a.b * a.h;
  const int64_t pairs = heads * half, pass = a.d - a.rot;
  const int64_t total = pairs + heads * pass;
  const float ms = float(a.mscale);
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < total; k += int64_t(gridDim.x) * blockDim.x) {
    if (k >= pairs) {  // pass-through element
      const int64_t q = k - pairs, hd = q / pass, i = a.rot + (q - hd * pass);
      out[hd * a.d + i] = t[hd * a.d + i];
      continue;
    }
    const int64_t hd = k / half, p = k - hd * half;
    const int64_t sb = hd / a.h, si = sb / a.b, bi = sb - si * a.b;
    const float* f = freqs + (a.freqs_b_stride ? (si * a.b + bi) * a.rot : si * a.rot);
    int64_t ia, ib, oa, ob;
    if (a.layout == RopeLayout::RotateHalf) { ia = oa = p; ib = ob = p + half; }
    else if (a.layout == RopeLayout::Interleaved) { ia = oa = 2 * p; ib = ob = 2 * p + 1; }
    else { ia = 2 * p; ib = 2 * p + 1; oa = p; ob = p + half; }
    float sa, ca, sb_, cb;
    sincosf(f[oa], &sa, &ca);
    sincosf(f[ob], &sb_, &cb);
    sa *= ms; ca *= ms; sb_ *= ms; cb *= ms;
    const T* x = t + hd * a.d;
    T* o = out + hd * a.d;
    if (!a.backward) {
      const float xa = to_f(x[ia]), xb = to_f(x[ib]);
      o[oa] = from_f<T>(xa * ca - xb * sa);
      o[ob] = from_f<T>(xb * cb + xa * sb_);
    } else {
      const float ga = to_f(x[oa]), gb = to_f(x[ob]);
      o[ia] = from_f<T>(ga * ca + gb * sb_);
      o[ib] = from_f<T>(gb * cb - ga * sa);
    }
  }
}

}  // namespace

void rope(const RopeArgs& a, cudaStream_t s) {
  const int64_t heads = a.s * a.b * a.h, total = heads * (a.rot / 2) + heads * (a.d - a.rot);
  MTM_GPU_DISPATCH(a.dtype, "rope", (rope_kernel<scalar_t><<<grid_for(total, 256), 256, 0, s>>>(a)));
  check_launch("rope");
}

}  // namespace gpu
}  // namespace mtm
