// Tensor-level implementations of every mtmegatron op, written once over a device policy `Dev` that supplies
// the kernel cores (mtm::cpu::* for CPU, the CUDA launchers for CUDA, their MUSA port for PrivateUse1) and says
// whether the rms_norm weight gradient comes back reduced (CPU) or as per-block partials (GPU).
// Included by kernels/bind/cpu.cpp and kernels/bind/cuda.cpp (ported to kernels/musa/bind_musa.cpp).
#pragma once
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <optional>
#include <tuple>
#include <vector>

#include "mtm/args.h"

namespace mtm {
namespace bind {

using at::Tensor;
using OptTensor = std::optional<Tensor>;

inline DType dtype_of(const Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::F32;
    case at::kDouble: return DType::F64;
    case at::kBFloat16: return DType::BF16;
    case at::kHalf: return DType::F16;
    default: TORCH_CHECK(false, "mtmegatron: unsupported dtype ", t.scalar_type());
  }
}
inline at::ScalarType acc_type(const Tensor& t) { return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }
inline const void* ptr_or_null(const OptTensor& t) { return t.has_value() ? t->data_ptr() : nullptr; }

template <class Dev>
std::tuple<Tensor, Tensor, Tensor> rms_norm_impl(const Tensor& input, const OptTensor& residual,
                                                 const Tensor& weight, double eps) {
  c10::DeviceGuard guard(input.device());
  TORCH_CHECK(weight.dim() == 1 && input.size(-1) == weight.size(0), "rms_norm: weight must be [hidden]");
  Tensor x = input.contiguous(), w = weight.contiguous();
  OptTensor r;
  if (residual.has_value()) {
    TORCH_CHECK(residual->sizes() == input.sizes() && residual->scalar_type() == input.scalar_type(),
                "add_rms_norm: residual must match input");
    r = residual->contiguous();
  }
  Tensor y = at::empty_like(x);
  Tensor rstd = at::empty(x.sizes().slice(0, x.dim() - 1), x.options().dtype(acc_type(x)));
  Tensor res_out = r.has_value() ? at::empty_like(x) : Tensor();
  RmsNormFwdArgs a{dtype_of(x), dtype_of(w), x.data_ptr(), ptr_or_null(r), w.data_ptr(), y.data_ptr(),
                   r.has_value() ? res_out.data_ptr() : nullptr, rstd.data_ptr(),
                   x.numel() / std::max<int64_t>(x.size(-1), 1), x.size(-1), eps};
  if (x.numel() > 0) Dev::rms_norm_fwd(a);
  return {y, res_out, rstd};
}

template <class Dev>
std::tuple<Tensor, Tensor> rms_norm(const Tensor& input, const Tensor& weight, double eps) {
  auto out = rms_norm_impl<Dev>(input, std::nullopt, weight, eps);
  return {std::get<0>(out), std::get<2>(out)};
}

template <class Dev>
std::tuple<Tensor, Tensor, Tensor> add_rms_norm(const Tensor& input, const Tensor& residual, const Tensor& weight,
                                                double eps) {
  return rms_norm_impl<Dev>(input, residual, weight, eps);
}

template <class Dev>
std::tuple<Tensor, Tensor> rms_norm_backward(const Tensor& grad_out, const Tensor& input, const Tensor& weight,
                                             const Tensor& rstd, const OptTensor& grad_residual) {
  c10::DeviceGuard guard(input.device());
  Tensor g = grad_out.contiguous(), x = input.contiguous(), w = weight.contiguous(), rs = rstd.contiguous();
  OptTensor gr;
  if (grad_residual.has_value()) gr = grad_residual->contiguous();
  const int64_t cols = x.size(-1), rows = x.numel() / std::max<int64_t>(cols, 1);
  Tensor gx = at::empty_like(x);
  const int64_t parts = Dev::rms_norm_bwd_num_parts(rows, cols);
  Tensor gw = parts == 0 ? at::empty_like(w) : at::empty({parts, cols}, x.options().dtype(acc_type(x)));
  if (rows == 0) return {gx, at::zeros_like(w)};
  RmsNormBwdArgs a{dtype_of(x), dtype_of(w), g.data_ptr(), x.data_ptr(), w.data_ptr(), rs.data_ptr(),
                   ptr_or_null(gr), gx.data_ptr(), gw.data_ptr(), parts, rows, cols};
  Dev::rms_norm_bwd(a);
  if (parts != 0) gw = gw.sum(0).to(w.scalar_type());
  return {gx, gw};
}

template <class Dev>
Tensor swiglu(const Tensor& input) {
  c10::DeviceGuard guard(input.device());
  TORCH_CHECK(input.size(-1) % 2 == 0, "swiglu: last dim must be even (cat([gate, up]))");
  Tensor x = input.contiguous();
  auto sizes = x.sizes().vec();
  sizes.back() /= 2;
  Tensor y = at::empty(sizes, x.options());
  SwigluArgs a{dtype_of(x), x.data_ptr(), nullptr, y.data_ptr(), y.numel() / std::max<int64_t>(sizes.back(), 1),
               sizes.back()};
  if (y.numel() > 0) Dev::swiglu_fwd(a);
  return y;
}

template <class Dev>
Tensor swiglu_backward(const Tensor& grad_out, const Tensor& input) {
  c10::DeviceGuard guard(input.device());
  Tensor x = input.contiguous(), g = grad_out.contiguous();
  Tensor gx = at::empty_like(x);
  const int64_t n = x.size(-1) / 2;
  SwigluArgs a{dtype_of(x), x.data_ptr(), g.data_ptr(), gx.data_ptr(), g.numel() / std::max<int64_t>(n, 1), n};
  if (g.numel() > 0) Dev::swiglu_bwd(a);
  return gx;
}

template <class Dev>
Tensor rope_impl(const Tensor& input, const Tensor& freqs, int64_t layout, double mscale, bool backward) {
  c10::DeviceGuard guard(input.device());
  TORCH_CHECK(input.dim() == 4, "rope: expects [s, b, h, d]");
  TORCH_CHECK(freqs.dim() == 4 && freqs.size(0) == input.size(0) && freqs.size(2) == 1 &&
                  (freqs.size(1) == 1 || freqs.size(1) == input.size(1)),
              "rope: freqs must be [s, 1 or b, 1, rot]");
  const int64_t rot = freqs.size(3);
  TORCH_CHECK(rot % 2 == 0 && rot <= input.size(3), "rope: rotary dim must be even and <= head dim");
  TORCH_CHECK(layout >= 0 && layout <= 2, "rope: layout must be 0 (rotate-half), 1 (interleaved) or 2 (mla)");
  Tensor t = input.contiguous(), f = freqs.to(acc_type(input)).contiguous();
  Tensor out = at::empty_like(t);
  RopeArgs a{dtype_of(t), t.data_ptr(), f.data_ptr(), out.data_ptr(), t.size(0), t.size(1), t.size(2),
             t.size(3), rot, freqs.size(1) == 1 ? 0 : rot, static_cast<RopeLayout>(layout), mscale, backward};
  if (t.numel() > 0) Dev::rope(a);
  return out;
}

template <class Dev>
Tensor rope(const Tensor& input, const Tensor& freqs, int64_t layout, double mscale) {
  return rope_impl<Dev>(input, freqs, layout, mscale, false);
}
template <class Dev>
Tensor rope_backward(const Tensor& grad_out, const Tensor& freqs, int64_t layout, double mscale) {
  return rope_impl<Dev>(grad_out, freqs, layout, mscale, true);
}

template <class Dev>
Tensor softmax_impl(const Tensor& x_or_y, const OptTensor& grad, const OptTensor& mask, double scale,
                    bool causal) {
  c10::DeviceGuard guard(x_or_y.device());
  Tensor x = x_or_y.contiguous();
  const int64_t sk = x.size(-1), sq = x.size(-2);
  int64_t heads = 1, batches = x.numel() / std::max<int64_t>(sq * sk, 1), mstride = 0;
  OptTensor m;
  if (mask.has_value()) {
    TORCH_CHECK(x.dim() == 4 && mask->dim() == 4 && mask->size(1) == 1 && mask->size(2) == sq &&
                    mask->size(3) == sk && (mask->size(0) == 1 || mask->size(0) == x.size(0)),
                "scaled_masked_softmax: input [b, np, sq, sk], mask [b or 1, 1, sq, sk]");
    m = mask->to(at::kBool).contiguous();
    heads = x.size(1);
    mstride = mask->size(0) == 1 ? 0 : sq * sk;
  }
  if (causal) TORCH_CHECK(sq == sk, "scaled_upper_triang_masked_softmax: needs sq == sk");
  Tensor g = grad.has_value() ? grad->contiguous() : Tensor();
  Tensor out = at::empty_like(x);
  SoftmaxArgs a{dtype_of(x), x.data_ptr(), x.data_ptr(), grad.has_value() ? g.data_ptr() : nullptr,
                m.has_value() ? m->data_ptr<bool>() : nullptr, out.data_ptr(), batches, heads, sq, sk, mstride,
                causal, scale};
  if (x.numel() > 0) {
    if (grad.has_value()) Dev::softmax_bwd(a);
    else Dev::softmax_fwd(a);
  }
  return out;
}

template <class Dev>
Tensor scaled_masked_softmax(const Tensor& input, const OptTensor& mask, double scale) {
  return softmax_impl<Dev>(input, std::nullopt, mask, scale, false);
}
template <class Dev>
Tensor scaled_masked_softmax_backward(const Tensor& grad_out, const Tensor& out, const OptTensor& mask,
                                      double scale) {
  return softmax_impl<Dev>(out, grad_out, mask, scale, false);
}
template <class Dev>
Tensor scaled_upper_triang_masked_softmax(const Tensor& input, double scale) {
  return softmax_impl<Dev>(input, std::nullopt, std::nullopt, scale, true);
}
template <class Dev>
Tensor scaled_upper_triang_masked_softmax_backward(const Tensor& grad_out, const Tensor& out, double scale) {
  return softmax_impl<Dev>(out, grad_out, std::nullopt, scale, true);
}

template <class Dev>
std::tuple<Tensor, Tensor, Tensor> cross_entropy_stats(const Tensor& logits, const Tensor& target,
                                                       int64_t vocab_start) {
  c10::DeviceGuard guard(logits.device());
  Tensor l = logits.contiguous(), t = target.to(at::kLong).contiguous();
  const int64_t v = l.size(-1), rows = l.numel() / std::max<int64_t>(v, 1);
  TORCH_CHECK(t.numel() == rows, "cross_entropy: target must have one id per logits row");
  auto opts = l.options().dtype(acc_type(l));
  Tensor mx = at::empty(t.sizes(), opts), se = at::empty(t.sizes(), opts), tl = at::empty(t.sizes(), opts);
  CrossEntropyStatsArgs a{dtype_of(l), l.data_ptr(), t.data_ptr<int64_t>(), mx.data_ptr(), se.data_ptr(),
                          tl.data_ptr(), rows, v, vocab_start};
  if (rows > 0) Dev::cross_entropy_stats(a);
  return {mx, se, tl};
}

template <class Dev>
std::tuple<Tensor, Tensor> cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index) {
  auto st = cross_entropy_stats<Dev>(logits, target, 0);
  Tensor lse = std::get<0>(st) + std::get<1>(st).log();
  Tensor loss = at::where(target == ignore_index, at::zeros_like(lse), lse - std::get<2>(st));
  return {loss, lse};
}

template <class Dev>
Tensor cross_entropy_backward(const Tensor& grad_loss, const Tensor& logits, const Tensor& target,
                              const Tensor& lse, int64_t vocab_start, int64_t ignore_index) {
  c10::DeviceGuard guard(logits.device());
  Tensor l = logits.contiguous(), t = target.to(at::kLong).contiguous();
  Tensor g = grad_loss.to(acc_type(l)).contiguous(), s = lse.to(acc_type(l)).contiguous();
  Tensor gl = at::empty_like(l);
  const int64_t v = l.size(-1), rows = l.numel() / std::max<int64_t>(v, 1);
  CrossEntropyBwdArgs a{dtype_of(l), g.data_ptr(), l.data_ptr(), t.data_ptr<int64_t>(), s.data_ptr(),
                        gl.data_ptr(), rows, v, vocab_start, ignore_index};
  if (rows > 0) Dev::cross_entropy_bwd(a);
  return gl;
}

template <class Dev>
std::tuple<Tensor, Tensor> moe_permute_index(const Tensor& routing_map) {
  c10::DeviceGuard guard(routing_map.device());
  TORCH_CHECK(routing_map.dim() == 2, "moe_permute_index: routing_map must be [tokens, experts]");
  Tensor m = routing_map.to(at::kBool).contiguous();
  const int64_t num_out = m.sum().item<int64_t>();
  auto iopts = m.options().dtype(at::kLong);
  Tensor sorted = at::empty({num_out}, iopts);
  Tensor row_map = at::empty(m.sizes(), m.options().dtype(at::kInt));
  Tensor scratch = at::empty({m.size(1) + 1}, iopts);
  MoeIndexArgs a{m.data_ptr<bool>(), sorted.data_ptr<int64_t>(), row_map.data_ptr<int32_t>(),
                 scratch.data_ptr<int64_t>(), m.size(0), m.size(1)};
  if (m.numel() > 0) Dev::moe_index(a);
  return {sorted, row_map};
}

template <class Dev>
Tensor moe_permute(const Tensor& tokens, const Tensor& sorted_indices, const Tensor& row_id_map) {
  c10::DeviceGuard guard(tokens.device());
  TORCH_CHECK(tokens.dim() == 2, "moe_permute: tokens must be [tokens, hidden]");
  Tensor x = tokens.contiguous(), idx = sorted_indices.to(at::kLong).contiguous();
  Tensor out = at::empty({idx.size(0), x.size(1)}, x.options());
  MoePermuteArgs a{dtype_of(x), x.data_ptr(), idx.data_ptr<int64_t>(), out.data_ptr(), idx.size(0), x.size(1)};
  if (out.numel() > 0) Dev::moe_permute(a);
  (void)row_id_map;
  return out;
}

template <class Dev>
Tensor moe_unpermute(const Tensor& permuted, const Tensor& row_id_map, const OptTensor& probs) {
  c10::DeviceGuard guard(permuted.device());
  Tensor x = permuted.contiguous(), rm = row_id_map.to(at::kInt).contiguous();
  OptTensor p;
  if (probs.has_value()) p = probs->to(acc_type(x)).contiguous();
  Tensor out = at::empty({rm.size(0), x.size(1)}, x.options());
  MoeUnpermuteArgs a{dtype_of(x), x.data_ptr(), rm.data_ptr<int32_t>(), ptr_or_null(p), nullptr, out.data_ptr(),
                     nullptr, rm.size(0), rm.size(1), x.size(1)};
  if (out.numel() > 0) Dev::moe_unpermute_fwd(a);
  return out;
}

template <class Dev>
std::tuple<Tensor, Tensor> moe_unpermute_backward(const Tensor& grad_out, const Tensor& permuted,
                                                  const Tensor& row_id_map, const OptTensor& probs) {
  c10::DeviceGuard guard(permuted.device());
  Tensor x = permuted.contiguous(), g = grad_out.contiguous(), rm = row_id_map.to(at::kInt).contiguous();
  OptTensor p;
  if (probs.has_value()) p = probs->to(acc_type(x)).contiguous();
  Tensor gx = at::empty_like(x);
  Tensor gp = probs.has_value() ? at::empty(rm.sizes(), x.options().dtype(acc_type(x)))
                                : at::empty({0}, x.options().dtype(acc_type(x)));
  MoeUnpermuteArgs a{dtype_of(x), x.data_ptr(), rm.data_ptr<int32_t>(), ptr_or_null(p), g.data_ptr(),
                     gx.data_ptr(), probs.has_value() ? gp.data_ptr() : nullptr, rm.size(0), rm.size(1), x.size(1)};
  if (rm.numel() > 0 && x.size(1) > 0) Dev::moe_unpermute_bwd(a);
  if (probs.has_value()) gp = gp.to(probs->scalar_type());
  return {gx, gp};
}

template <class Dev>
std::tuple<Tensor, Tensor> moe_router_topk(const Tensor& logits, const OptTensor& expert_bias, int64_t topk,
                                           int64_t num_groups, int64_t group_topk, double scaling_factor) {
  c10::DeviceGuard guard(logits.device());
  TORCH_CHECK(logits.dim() == 2, "moe_router_topk: logits must be [tokens, experts]");
  const int64_t E = logits.size(1);
  TORCH_CHECK(topk >= 1 && topk <= E, "moe_router_topk: need 1 <= topk <= experts");
  if (group_topk > 0) {
    TORCH_CHECK(num_groups > 0 && E % num_groups == 0 && group_topk <= num_groups && topk % group_topk == 0 &&
                    topk / group_topk <= E / num_groups && topk <= group_topk * (E / num_groups),
                "moe_router_topk: invalid group-limited routing parameters");
  }
  Tensor l = logits.contiguous();
  OptTensor b;
  if (expert_bias.has_value()) b = expert_bias->to(acc_type(l)).contiguous();
  Tensor probs = at::empty_like(l);
  Tensor map = at::empty(l.sizes(), l.options().dtype(at::kBool));
  RouterArgs a{dtype_of(l), l.data_ptr(), ptr_or_null(b), nullptr, nullptr, probs.data_ptr(), map.data_ptr<bool>(),
               l.size(0), E, static_cast<int>(topk), static_cast<int>(num_groups), static_cast<int>(group_topk),
               scaling_factor};
  if (l.numel() > 0) Dev::router_topk_fwd(a);
  return {probs, map};
}

template <class Dev>
Tensor moe_router_topk_backward(const Tensor& grad_probs, const Tensor& logits, const Tensor& routing_map,
                                int64_t topk, double scaling_factor) {
  c10::DeviceGuard guard(logits.device());
  Tensor l = logits.contiguous(), g = grad_probs.contiguous(), m = routing_map.to(at::kBool).contiguous();
  Tensor gl = at::empty_like(l);
  RouterArgs a{dtype_of(l), l.data_ptr(), nullptr, g.data_ptr(), m.data_ptr<bool>(), gl.data_ptr(), nullptr,
               l.size(0), l.size(1), static_cast<int>(topk), 0, 0, scaling_factor};
  if (l.numel() > 0) Dev::router_topk_bwd(a);
  return gl;
}

template <class Dev>
void adam_step(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
               double lr, double beta1, double beta2, double eps, double weight_decay, int64_t step) {
  const size_t n = params.size();
  TORCH_CHECK(grads.size() == n && exp_avgs.size() == n && exp_avg_sqs.size() == n,
              "adam_step: params, grads, exp_avgs, exp_avg_sqs must have the same length");
  if (n == 0) return;
  c10::DeviceGuard guard(params[0].device());
  std::vector<float*> p(n), m(n), v(n);
  std::vector<const void*> g(n);
  std::vector<Tensor> keep;
  std::vector<int64_t> numel(n);
  const auto gdt = grads[0].scalar_type();
  TORCH_CHECK(gdt == at::kFloat || gdt == at::kBFloat16, "adam_step: grads must be float32 or bfloat16");
  for (size_t i = 0; i < n; ++i) {
    TORCH_CHECK(params[i].scalar_type() == at::kFloat && exp_avgs[i].scalar_type() == at::kFloat &&
                    exp_avg_sqs[i].scalar_type() == at::kFloat,
                "adam_step: params and states must be float32 master tensors");
    TORCH_CHECK(params[i].is_contiguous() && exp_avgs[i].is_contiguous() && exp_avg_sqs[i].is_contiguous(),
                "adam_step: params and states must be contiguous (they are updated in place)");
    TORCH_CHECK(grads[i].scalar_type() == gdt && grads[i].numel() == params[i].numel() &&
                    exp_avgs[i].numel() == params[i].numel() && exp_avg_sqs[i].numel() == params[i].numel(),
                "adam_step: tensor ", i, " has mismatched sizes or grad dtype");
    keep.push_back(grads[i].contiguous());
    p[i] = params[i].data_ptr<float>();
    m[i] = exp_avgs[i].data_ptr<float>();
    v[i] = exp_avg_sqs[i].data_ptr<float>();
    g[i] = keep.back().data_ptr();
    numel[i] = params[i].numel();
  }
  AdamArgs a{gdt == at::kFloat ? DType::F32 : DType::BF16, static_cast<int64_t>(n), p.data(), g.data(), m.data(),
             v.data(), numel.data(), static_cast<float>(lr), static_cast<float>(beta1), static_cast<float>(beta2),
             static_cast<float>(eps), static_cast<float>(weight_decay), step};
  Dev::adam_step(a);
}

template <class Dev>
void register_all(torch::Library& m) {
  m.impl("rms_norm", &rms_norm<Dev>);
  m.impl("add_rms_norm", &add_rms_norm<Dev>);
  m.impl("rms_norm_backward", &rms_norm_backward<Dev>);
  m.impl("swiglu", &swiglu<Dev>);
  m.impl("swiglu_backward", &swiglu_backward<Dev>);
  m.impl("rope", &rope<Dev>);
  m.impl("rope_backward", &rope_backward<Dev>);
  m.impl("scaled_masked_softmax", &scaled_masked_softmax<Dev>);
  m.impl("scaled_masked_softmax_backward", &scaled_masked_softmax_backward<Dev>);
  m.impl("scaled_upper_triang_masked_softmax", &scaled_upper_triang_masked_softmax<Dev>);
  m.impl("scaled_upper_triang_masked_softmax_backward", &scaled_upper_triang_masked_softmax_backward<Dev>);
  m.impl("cross_entropy_stats", &cross_entropy_stats<Dev>);
  m.impl("cross_entropy", &cross_entropy<Dev>);
  m.impl("cross_entropy_backward", &cross_entropy_backward<Dev>);
  m.impl("moe_permute_index", &moe_permute_index<Dev>);
  m.impl("moe_permute", &moe_permute<Dev>);
  m.impl("moe_unpermute", &moe_unpermute<Dev>);
  m.impl("moe_unpermute_backward", &moe_unpermute_backward<Dev>);
  m.impl("moe_router_topk", &moe_router_topk<Dev>);
  m.impl("moe_router_topk_backward", &moe_router_topk_backward<Dev>);
  m.impl("adam_step", &adam_step<Dev>);
}

}  // namespace bind
}  // namespace mtm
