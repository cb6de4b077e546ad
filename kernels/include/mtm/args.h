// Argument blocks of every kernel core: raw pointers, sizes and scalars only, so that the CPU (.cpp), CUDA (.cu)
// and ported MUSA (.mu) cores share one signature per op. "acc" pointers are float for F32/BF16/F16 data and
// double for F64 data (the CPU cores accept F64 so gradients can be checked in float64).
#pragma once
#include <cstdint>
#include "mtm/types.h"

namespace mtm {

struct RmsNormFwdArgs {
  DType dtype, wdtype;
  const void* x;         // [rows, cols]
  const void* residual;  // [rows, cols] or nullptr; when given, the normalised input is x + residual
  const void* weight;    // [cols]
  void* y;               // [rows, cols]
  void* residual_out;    // [rows, cols] (x + residual) or nullptr
  void* rstd;            // [rows] acc
  int64_t rows, cols;
  double eps;
};

struct RmsNormBwdArgs {
  DType dtype, wdtype;
  const void* grad_y;         // [rows, cols]
  const void* x;              // the normalised input (x + residual when fused)
  const void* weight;         // [cols]
  const void* rstd;           // [rows] acc
  const void* grad_residual;  // [rows, cols] or nullptr: gradient arriving at residual_out
  void* grad_x;               // [rows, cols]
  void* grad_w_partial;       // [num_parts, cols] acc (GPU: sized by rms_norm_bwd_num_parts); CPU: [cols] wdtype
  int64_t num_parts;
  int64_t rows, cols;
};

struct SwigluArgs {
  DType dtype;
  const void* x;       // [rows, 2*cols] = cat([gate, up])
  const void* grad_y;  // [rows, cols] (backward only)
  void* out;           // forward: y [rows, cols]; backward: grad_x [rows, 2*cols]
  int64_t rows, cols;
};

struct RopeArgs {
  DType dtype;
  const void* t;      // [s, b, h, d] contiguous
  const void* freqs;  // [s, 1 or b, 1, rot] acc, contiguous
  void* out;          // [s, b, h, d]
  int64_t s, b, h, d, rot;
  int64_t freqs_b_stride;  // 0 when freqs broadcast over the batch, rot otherwise
  RopeLayout layout;
  double mscale;
  bool backward;  // apply the transpose (gradient) of the rotation
};

struct SoftmaxArgs {
  DType dtype;
  const void* x;       // forward input [batches, sq, sk]
  const void* y;       // backward: forward output
  const void* grad_y;  // backward: incoming gradient
  const bool* mask;    // [mb, 1, sq, sk], true = masked out; nullptr = none
  void* out;
  int64_t batches, heads, sq, sk;  // batches = b * heads
  int64_t mask_batch_stride;       // sq*sk, or 0 when the mask broadcasts over the batch
  bool causal;                     // upper-triangular mask (column > row masked)
  double scale;
};

struct CrossEntropyStatsArgs {
  DType dtype;
  const void* logits;     // [rows, vocab] (this rank's vocab shard)
  const int64_t* target;  // [rows] global vocab ids
  void* max;              // [rows] acc
  void* sumexp;           // [rows] acc, sum exp(logit - max)
  void* target_logit;     // [rows] acc, 0 when the target is not in this shard
  int64_t rows, vocab, vocab_start;
};

struct CrossEntropyBwdArgs {
  DType dtype;
  const void* grad_loss;  // [rows] acc
  const void* logits;     // [rows, vocab]
  const int64_t* target;  // [rows]
  const void* lse;        // [rows] acc, global log-sum-exp
  void* grad_logits;      // [rows, vocab]
  int64_t rows, vocab, vocab_start, ignore_index;
};

struct MoeIndexArgs {
  const bool* routing_map;  // [tokens, experts]
  int64_t* sorted_indices;  // [num_out] token id of each permuted row (expert-major, token order)
  int32_t* row_id_map;      // [tokens, experts] permuted row of (token, expert) or -1
  int64_t* expert_offsets;  // [experts + 1] scratch
  int64_t tokens, experts;
};

struct MoePermuteArgs {
  DType dtype;
  const void* tokens;             // [tokens, hidden]
  const int64_t* sorted_indices;  // [num_out]
  void* out;                      // [num_out, hidden]
  int64_t num_out, hidden;
};

struct MoeUnpermuteArgs {
  DType dtype;
  const void* permuted;       // [num_out, hidden]
  const int32_t* row_id_map;  // [tokens, experts]
  const void* probs;          // [tokens, experts] acc or nullptr
  const void* grad_out;       // backward: [tokens, hidden]
  void* out;                  // forward: [tokens, hidden]; backward: grad_permuted [num_out, hidden]
  void* grad_probs;           // backward: [tokens, experts] acc
  int64_t tokens, experts, hidden;
};

struct RouterArgs {
  DType dtype;
  const void* logits;       // [tokens, experts]
  const void* expert_bias;  // [experts] acc or nullptr
  const void* grad_probs;   // backward: [tokens, experts]
  const bool* routing_map;  // backward input
  void* probs;              // forward: [tokens, experts] (dtype); backward: grad_logits
  bool* routing_map_out;    // forward: [tokens, experts]
  int64_t tokens, experts;
  int topk, num_groups, group_topk;
  double scaling_factor;
};

struct AdamArgs {
  DType grad_dtype;  // F32 or BF16; params and states are F32
  int64_t num_tensors;
  float* const* params;
  const void* const* grads;
  float* const* exp_avgs;
  float* const* exp_avg_sqs;
  const int64_t* numels;
  float lr, beta1, beta2, eps, weight_decay;
  int64_t step;
};

}  // namespace mtm

// Every kernel core entry point (name, argument block); CPU and GPU implement the same list.
#define MTM_KERNEL_OPS(X)                       \
  X(rms_norm_fwd, RmsNormFwdArgs)               \
  X(rms_norm_bwd, RmsNormBwdArgs)               \
  X(swiglu_fwd, SwigluArgs)                     \
  X(swiglu_bwd, SwigluArgs)                     \
  X(rope, RopeArgs)                             \
  X(softmax_fwd, SoftmaxArgs)                   \
  X(softmax_bwd, SoftmaxArgs)                   \
  X(cross_entropy_stats, CrossEntropyStatsArgs) \
  X(cross_entropy_bwd, CrossEntropyBwdArgs)     \
  X(moe_index, MoeIndexArgs)                    \
  X(moe_permute, MoePermuteArgs)                \
  X(moe_unpermute_fwd, MoeUnpermuteArgs)        \
  X(moe_unpermute_bwd, MoeUnpermuteArgs)        \
  X(router_topk_fwd, RouterArgs)                \
  X(router_topk_bwd, RouterArgs)                \
  X(adam_step, AdamArgs)
