// Registers the CUDA kernel cores (kernels/cuda/*.cu) for the CUDA dispatch key, launching on the current
// stream. kernels/musa/bind_musa.cpp is generated from this file by mtmegatron/ops/musa_port.py.
#include <c10/cuda/CUDAStream.h>

#include "mtm/gpu.h"
#include "ops.h"

namespace {
struct CudaDev {
#define MTM_FWD(name, A) \
  static void name(const mtm::A& a) { mtm::gpu::name(a, c10::cuda::getCurrentCUDAStream().stream()); }
  MTM_KERNEL_OPS(MTM_FWD)
#undef MTM_FWD
  static int64_t rms_norm_bwd_num_parts(int64_t rows, int64_t cols) {
    return mtm::gpu::rms_norm_bwd_num_parts(rows, cols);
  }
};
}  // namespace

TORCH_LIBRARY_IMPL(mtmegatron, CUDA, m) { mtm::bind::register_all<CudaDev>(m); }
