// CPU core of the cross-entropy loss fused with log-softmax over the vocab. The forward produces per-row
// partial statistics of this rank's vocab shard (max, sum exp(logit - max), target logit) which the Python side
// combines across tensor-parallel ranks; the backward writes softmax - onehot scaled by the loss gradient.
// fp32/bf16 rows run kW-lane vector code (8 or 16 lanes) (mtm/cpu_vec.h); the max pass and the exp pass read the row twice
// (a 32k-vocab bf16 row is 64 KiB and stays in L2 between them). fp64 keeps the scalar loops.
#include "mtm/cpu_vec.h"

namespace mtm {
namespace MTM_CPU_NS {
namespace {

template <typename T>
void stats(const CrossEntropyStatsArgs& a) {
  using A = acc_t<T>;
  const T* logits = static_cast<const T*>(a.logits);
  A* mx = static_cast<A*>(a.max);
  A* se = static_cast<A*>(a.sumexp);
  A* tl = static_cast<A*>(a.target_logit);
  const int64_t v = a.vocab;
  parallel_chunks(a.rows, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* lr = logits + r * v;
      A m = -INFINITY, sum = 0;
      if constexpr (kVec<T>) {
        VF mv = vset(-INFINITY);
        for (int64_t j = 0; j < v; j += kW) mv = vmax(mv, vload_part(lr + j, v - j, -INFINITY));
        m = hmax(mv);
        const VF mb = vset(m);
        VF sv = vset(0.0f);
        for (int64_t j = 0; j < v; j += kW) {
          VF e = vexp(vload_part(lr + j, v - j, 0.0f) - mb);
          sv = sv + (v - j < kW ? vselect(vlanes_from(v - j), vset(0.0f), e) : e);
        }
        sum = hsum(sv);
      } else {
        for (int64_t j = 0; j < v; ++j) {
          A s = ld(lr, j);
          m = s > m ? s : m;
        }
        for (int64_t j = 0; j < v; ++j) sum += fast_exp(ld(lr, j) - m);
      }
      mx[r] = m;
      se[r] = sum;
      const int64_t t = a.target[r] - a.vocab_start;
      tl[r] = (t >= 0 && t < v) ? ld(lr, t) : A(0);
    }
  });
}

template <typename T>
void bwd(const CrossEntropyBwdArgs& a) {
  using A = acc_t<T>;
  const T* logits = static_cast<const T*>(a.logits);
  const A* gl = static_cast<const A*>(a.grad_loss);
  const A* lse = static_cast<const A*>(a.lse);
  T* gx = static_cast<T*>(a.grad_logits);
  const int64_t v = a.vocab;
  parallel_chunks(a.rows, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* lr = logits + r * v;
      T* o = gx + r * v;
      const bool ignored = a.target[r] == a.ignore_index;
      const A g = ignored ? A(0) : gl[r];
      const A l = lse[r];
      if constexpr (kVec<T>) {
        const VF gv = vset(g), lv = vset(l);
        for (int64_t j = 0; j < v; j += kW) vstore_part(o + j, v - j, gv * vexp(vload_part(lr + j, v - j, 0.0f) - lv));
      } else {
        for (int64_t j = 0; j < v; ++j) st(o, j, g * fast_exp(ld(lr, j) - l));
      }
      const int64_t t = a.target[r] - a.vocab_start;
      if (!ignored && t >= 0 && t < v) st(o, t, g * fast_exp(ld(lr, t) - l) - g);
    }
  });
}

}  // namespace

void cross_entropy_stats(const CrossEntropyStatsArgs& a) {
  MTM_CPU_DISPATCH(a.dtype, "cross_entropy", stats<scalar_t>(a));
}
void cross_entropy_bwd(const CrossEntropyBwdArgs& a) {
  MTM_CPU_DISPATCH(a.dtype, "cross_entropy_backward", bwd<scalar_t>(a));
}

}  // namespace MTM_CPU_NS
}  // namespace mtm
