// Host entry points of the CUDA kernel cores (kernels/cuda/*.cu): raw pointers, sizes and the stream to launch
// on. Framework-free (CUDA runtime only) so the .cu files compile with nvcc alone and port to MUSA (.mu) by
// renaming. Errors are reported as std::runtime_error / std::invalid_argument.
#pragma once
#include <cuda_runtime.h>

#include "mtm/args.h"

namespace mtm {
namespace gpu {
#define MTM_DECLARE(name, A) void name(const A&, cudaStream_t);
MTM_KERNEL_OPS(MTM_DECLARE)
#undef MTM_DECLARE
// Rows of fp32 weight-gradient partials rms_norm_bwd writes (the binding sums them).
int64_t rms_norm_bwd_num_parts(int64_t rows, int64_t cols);
}  // namespace gpu
}  // namespace mtm
