// CPU core of MoE permute/unpermute by routing map (megatron's order: rows grouped by expert, tokens ascending
// inside an expert). moe_index builds sorted_indices and the [tokens, experts] row map that lets unpermute and
// the backward passes run per token without atomics.
#include <algorithm>
#include <vector>
#include "mtm/cpu_vec.h"

namespace mtm {
namespace MTM_CPU_NS {

void moe_index(const MoeIndexArgs& a) {
  const int64_t T = a.tokens, E = a.experts;
  int64_t* off = a.expert_offsets;
  for (int64_t e = 0; e <= E; ++e) off[e] = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < E; ++e) off[e + 1] += a.routing_map[t * E + e] ? 1 : 0;
  for (int64_t e = 0; e < E; ++e) off[e + 1] += off[e];
  parallel_chunks(E, 1, [&](int64_t e0, int64_t e1) {
    for (int64_t e = e0; e < e1; ++e) {
      int64_t row = off[e];
      for (int64_t t = 0; t < T; ++t) {
        if (a.routing_map[t * E + e]) {
          a.sorted_indices[row] = t;
          a.row_id_map[t * E + e] = static_cast<int32_t>(row);
          ++row;
        } else {
          a.row_id_map[t * E + e] = -1;
        }
      }
    }
  });
}

namespace {

template <typename T>
void permute(const MoePermuteArgs& a) {
  const T* in = static_cast<const T*>(a.tokens);
  T* out = static_cast<T*>(a.out);
  const int64_t h = a.hidden;
  parallel_chunks(a.num_out, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) std::memcpy(out + r * h, in + a.sorted_indices[r] * h, sizeof(T) * h);
  });
}

template <typename T>
void unpermute_fwd(const MoeUnpermuteArgs& a) {
  using A = acc_t<T>;
  const T* in = static_cast<const T*>(a.permuted);
  const A* probs = static_cast<const A*>(a.probs);
  T* out = static_cast<T*>(a.out);
  const int64_t h = a.hidden, E = a.experts;
  parallel_chunks(a.tokens, 1, [&](int64_t t0, int64_t t1) {
    std::vector<A> acc(h + kW);  // padded: the vector loop reads and writes whole kW-lane blocks
    for (int64_t t = t0; t < t1; ++t) {
      std::fill(acc.begin(), acc.end(), A(0));
      A* ac = acc.data();
      for (int64_t e = 0; e < E; ++e) {
        const int32_t r = a.row_id_map[t * E + e];
        if (r < 0) continue;
        const T* src = in + static_cast<int64_t>(r) * h;
        const A p = probs ? probs[t * E + e] : A(1);
        if constexpr (kVec<T>) {
          const VF pv = vset(p);
          for (int64_t i = 0; i < h; i += kW) vstore(ac + i, vfma(vload_part(src + i, h - i, 0.0f), pv, vload(ac + i)));
        } else {
          for (int64_t i = 0; i < h; ++i) ac[i] += ld(src, i) * p;
        }
      }
      T* o = out + t * h;
      if constexpr (kVec<T>) {
        for (int64_t i = 0; i < h; i += kW) vstore_part(o + i, h - i, vload(ac + i));
      } else {
        for (int64_t i = 0; i < h; ++i) st(o, i, ac[i]);
      }
    }
  });
}

// grad_permuted[row(t,e)] = grad_out[t] * probs[t,e]; grad_probs[t,e] = <grad_out[t], permuted[row(t,e)]>.
template <typename T>
void unpermute_bwd(const MoeUnpermuteArgs& a) {
  using A = acc_t<T>;
  const T* perm = static_cast<const T*>(a.permuted);
  const T* go = static_cast<const T*>(a.grad_out);
  const A* probs = static_cast<const A*>(a.probs);
  T* gp = static_cast<T*>(a.out);
  A* gprobs = static_cast<A*>(a.grad_probs);
  const int64_t h = a.hidden, E = a.experts;
  parallel_chunks(a.tokens, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const T* g = go + t * h;
      for (int64_t e = 0; e < E; ++e) {
        const int32_t r = a.row_id_map[t * E + e];
        if (r < 0) {
          if (gprobs) gprobs[t * E + e] = 0;
          continue;
        }
        const T* src = perm + static_cast<int64_t>(r) * h;
        T* dst = gp + static_cast<int64_t>(r) * h;
        const A p = probs ? probs[t * E + e] : A(1);
        A dot = 0;
#pragma omp simd reduction(+ : dot)
        for (int64_t i = 0; i < h; ++i) {
          A gi = ld(g, i);
          dot += gi * ld(src, i);
          st(dst, i, gi * p);
        }
        if (gprobs) gprobs[t * E + e] = dot;
      }
    }
  });
}

}  // namespace

void moe_permute(const MoePermuteArgs& a) { MTM_CPU_DISPATCH(a.dtype, "moe_permute", permute<scalar_t>(a)); }
void moe_unpermute_fwd(const MoeUnpermuteArgs& a) {
  MTM_CPU_DISPATCH(a.dtype, "moe_unpermute", unpermute_fwd<scalar_t>(a));
}
void moe_unpermute_bwd(const MoeUnpermuteArgs& a) {
  MTM_CPU_DISPATCH(a.dtype, "moe_unpermute_backward", unpermute_bwd<scalar_t>(a));
}

}  // namespace MTM_CPU_NS
}  // namespace mtm
