// CPU core of rotary position embedding on [s, b, h, d] with freqs [s, 1|b, 1, rot]; rotate-half, interleaved
// and MLA (de-interleave then rotate-half) layouts; dims past rot pass through. backward=true applies the
// transposed rotation, which is the gradient with respect to t.
#include <vector>
#include "mtm/cpu_vec.h"

namespace mtm {
namespace MTM_CPU_NS {
namespace {

// Index map of pair p: inputs (ia, ib), outputs/frequency slots (oa, ob).
inline void pair_index(RopeLayout layout, int64_t p, int64_t half, int64_t& ia, int64_t& ib, int64_t& oa,
                       int64_t& ob) {
  if (layout == RopeLayout::RotateHalf) {
    ia = oa = p; ib = ob = p + half;
  } else if (layout == RopeLayout::Interleaved) {
    ia = oa = 2 * p; ib = ob = 2 * p + 1;
  } else {
    ia = 2 * p; ib = 2 * p + 1; oa = p; ob = p + half;
  }
}

template <typename T>
void run(const RopeArgs& a) {
  using A = acc_t<T>;
  const T* t = static_cast<const T*>(a.t);
  const A* freqs = static_cast<const A*>(a.freqs);
  T* out = static_cast<T*>(a.out);
  const int64_t rot = a.rot, half = rot / 2, d = a.d;
  const int64_t rows = a.s * a.b;  // one (position, batch) pair: h heads share cos/sin
  parallel_chunks(rows, 1, [&](int64_t r0, int64_t r1) {
    std::vector<A> cs(2 * rot);
    std::vector<int64_t> idx(4 * half);
    for (int64_t p = 0; p < half; ++p)
      pair_index(a.layout, p, half, idx[4 * p], idx[4 * p + 1], idx[4 * p + 2], idx[4 * p + 3]);
    const A* last_f = nullptr;
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t si = r / a.b, bi = r % a.b;
      const A* f = freqs + (a.freqs_b_stride ? (si * a.b + bi) * rot : si * rot);
      if (f != last_f) {  // batch rows of one position share freqs unless they come per batch
        last_f = f;
        for (int64_t i = 0; i < rot; ++i) {
          // megatron's freqs repeat (cat([f, f]) or pairwise): reuse a computed angle instead of new trig
          const int64_t same = (i >= half && f[i] == f[i - half]) ? i - half : (i > 0 && f[i] == f[i - 1]) ? i - 1 : -1;
          if (same >= 0) {
            cs[i] = cs[same];
            cs[rot + i] = cs[rot + same];
          } else {
            cs[i] = std::cos(f[i]) * A(a.mscale);
            cs[rot + i] = std::sin(f[i]) * A(a.mscale);
          }
        }
      }
      const A* c = cs.data();
      const A* sn = cs.data() + rot;
      for (int64_t hh = 0; hh < a.h; ++hh) {
        const T* x = t + (r * a.h + hh) * d;
        T* o = out + (r * a.h + hh) * d;
        if constexpr (kVec<T>) {
          if (a.layout == RopeLayout::RotateHalf) {
            for (int64_t p = 0; p < half; p += kW) {
              const int64_t k = half - p;
              VF xa = vload_part(x + p, k, 0.0f), xb = vload_part(x + p + half, k, 0.0f);
              VF ca = vload_part(c + p, k, 0.0f), cb = vload_part(c + p + half, k, 0.0f);
              VF sa = vload_part(sn + p, k, 0.0f), sb = vload_part(sn + p + half, k, 0.0f);
              if (!a.backward) {
                vstore_part(o + p, k, xa * ca - xb * sa);
                vstore_part(o + p + half, k, xb * cb + xa * sb);
              } else {
                vstore_part(o + p, k, xa * ca + xb * sb);
                vstore_part(o + p + half, k, xb * cb - xa * sa);
              }
            }
            for (int64_t i = rot; i < d; ++i) o[i] = x[i];
            continue;
          }
        }
        if (a.layout == RopeLayout::RotateHalf && !a.backward) {
#pragma omp simd
          for (int64_t p = 0; p < half; ++p) {
            A xa = ld(x, p), xb = ld(x, p + half);
            st(o, p, xa * c[p] - xb * sn[p]);
            st(o, p + half, xb * c[p + half] + xa * sn[p + half]);
          }
        } else if (a.layout == RopeLayout::RotateHalf) {
#pragma omp simd
          for (int64_t p = 0; p < half; ++p) {
            A ga = ld(x, p), gb = ld(x, p + half);
            st(o, p, ga * c[p] + gb * sn[p + half]);
            st(o, p + half, gb * c[p + half] - ga * sn[p]);
          }
        } else if (!a.backward) {
          for (int64_t p = 0; p < half; ++p) {
            const int64_t ia = idx[4 * p], ib = idx[4 * p + 1], oa = idx[4 * p + 2], ob = idx[4 * p + 3];
            A xa = ld(x, ia), xb = ld(x, ib);
            st(o, oa, xa * c[oa] - xb * sn[oa]);
            st(o, ob, xb * c[ob] + xa * sn[ob]);
          }
        } else {
          for (int64_t p = 0; p < half; ++p) {
            const int64_t ia = idx[4 * p], ib = idx[4 * p + 1], oa = idx[4 * p + 2], ob = idx[4 * p + 3];
            A ga = ld(x, oa), gb = ld(x, ob);
            st(o, ia, ga * c[oa] + gb * sn[ob]);
            st(o, ib, gb * c[ob] - ga * sn[oa]);
          }
        }
        for (int64_t i = rot; i < d; ++i) o[i] = x[i];
      }
    }
  });
}

}  // namespace

void rope(const RopeArgs& a) { MTM_CPU_DISPATCH(a.dtype, "rope", run<scalar_t>(a)); }

}  // namespace MTM_CPU_NS
}  // namespace mtm
