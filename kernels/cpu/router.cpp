// CPU core of the DeepSeek-V3 router top-k as one op: sigmoid scores, expert bias used for selection only,
// group-limited selection (group score = sum of the top topk/group_topk biased scores of the group), weights
// from the unbiased scores normalised over the chosen experts when topk > 1, times the scaling factor.
#include <vector>
#include "mtm/cpu_common.h"

namespace mtm {
namespace MTM_CPU_NS {
namespace {

template <typename T>
inline acc_t<T> round_to(acc_t<T> v) {
  T tmp[1];
  st(tmp, 0, v);
  return ld(tmp, 0);
}

// Index of the largest value among allowed entries not taken yet (lowest index on ties); -1 if none.
template <typename A>
inline int64_t argmax_free(const A* v, const char* ok, int64_t n) {
  int64_t best = -1;
  for (int64_t i = 0; i < n; ++i)
    if (ok[i] && (best < 0 || v[i] > v[best])) best = i;
  return best;
}

template <typename T>
void fwd(const RouterArgs& a) {
  using A = acc_t<T>;
  const T* logits = static_cast<const T*>(a.logits);
  const A* bias = static_cast<const A*>(a.expert_bias);
  T* probs = static_cast<T*>(a.probs);
  const int64_t E = a.experts;
  const bool grouped = a.group_topk > 0 && a.num_groups > 1;
  const int64_t G = grouped ? a.num_groups : 1, per = E / G;
  parallel_chunks(a.tokens, 64, [&](int64_t t0, int64_t t1) {
    std::vector<A> s(E), r(E), gs(G), tmp(per);
    std::vector<char> ok(E), gok(G), tok(per);
    std::vector<int64_t> chosen(a.topk);
    for (int64_t t = t0; t < t1; ++t) {
      const T* l = logits + t * E;
      for (int64_t e = 0; e < E; ++e) {
        s[e] = round_to<T>(sigmoid(ld(l, e)));
        r[e] = bias ? s[e] + bias[e] : s[e];
        ok[e] = 1;
      }
      if (grouped) {
        const int64_t kg = a.topk / a.group_topk;
        for (int64_t g = 0; g < G; ++g) {
          for (int64_t i = 0; i < per; ++i) tok[i] = 1;
          A sum = 0;
          for (int64_t k = 0; k < kg; ++k) {
            int64_t i = argmax_free(r.data() + g * per, tok.data(), per);
            sum += r[g * per + i];
            tok[i] = 0;
          }
          gs[g] = sum;
          gok[g] = 1;
        }
        std::vector<char> keep(G, 0);
        for (int64_t k = 0; k < a.group_topk; ++k) {
          int64_t g = argmax_free(gs.data(), gok.data(), G);
          keep[g] = 1;
          gok[g] = 0;
        }
        for (int64_t e = 0; e < E; ++e) ok[e] = keep[e / per];
      }
      A denom = 0;
      for (int64_t k = 0; k < a.topk; ++k) {
        int64_t e = argmax_free(r.data(), ok.data(), E);
        chosen[k] = e;
        ok[e] = 0;
        denom += s[e];
      }
      T* p = probs + t * E;
      bool* m = a.routing_map_out + t * E;
      for (int64_t e = 0; e < E; ++e) {
        st(p, e, A(0));
        m[e] = false;
      }
      const A norm = a.topk > 1 ? A(1) / (denom + A(1e-20)) : A(1);
      for (int64_t k = 0; k < a.topk; ++k) {
        const int64_t e = chosen[k];
        st(p, e, s[e] * norm * A(a.scaling_factor));
        m[e] = true;
      }
    }
  });
}

template <typename T>
void bwd(const RouterArgs& a) {
  using A = acc_t<T>;
  const T* logits = static_cast<const T*>(a.logits);
  const T* gp = static_cast<const T*>(a.grad_probs);
  T* gl = static_cast<T*>(a.probs);
  const int64_t E = a.experts;
  const A c = A(a.scaling_factor);
  parallel_chunks(a.tokens, 64, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const T* l = logits + t * E;
      const T* g = gp + t * E;
      const bool* m = a.routing_map + t * E;
      T* o = gl + t * E;
      A z = 0, gs = 0;
      for (int64_t e = 0; e < E; ++e)
        if (m[e]) {
          A s = round_to<T>(sigmoid(ld(l, e)));
          z += s;
          gs += ld(g, e) * s;
        }
      z += A(1e-20);
      for (int64_t e = 0; e < E; ++e) {
        if (!m[e]) {
          st(o, e, A(0));
          continue;
        }
        A sg = sigmoid(ld(l, e));
        A ds = a.topk > 1 ? c * (ld(g, e) / z - gs / (z * z)) : c * ld(g, e);
        st(o, e, ds * sg * (A(1) - sg));
      }
    }
  });
}

}  // namespace

void router_topk_fwd(const RouterArgs& a) { MTM_CPU_DISPATCH(a.dtype, "moe_router_topk", fwd<scalar_t>(a)); }
void router_topk_bwd(const RouterArgs& a) {
  MTM_CPU_DISPATCH(a.dtype, "moe_router_topk_backward", bwd<scalar_t>(a));
}

}  // namespace MTM_CPU_NS
}  // namespace mtm
