// Framework-free basics shared by the CPU, CUDA and MUSA kernel cores: the dtype tag passed across the
// binding boundary and the host/device qualifiers. No torch, no CUDA runtime headers here.
#pragma once
#include <cstdint>

#if defined(__CUDACC__) || defined(__MUSACC__)
#define MTM_HD __host__ __device__
#else
#define MTM_HD
#endif

namespace mtm {

enum class DType : int { F32 = 0, F64 = 1, BF16 = 2, F16 = 3 };

// Router score functions (only sigmoid is implemented natively; see docs/kernels.md).
enum class RopeLayout : int { RotateHalf = 0, Interleaved = 1, MlaDeinterleave = 2 };

}  // namespace mtm
