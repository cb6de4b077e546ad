// Python module mtmegatron._C: importing it registers every kernel's TORCH_LIBRARY_IMPL (static initialisers
// in the linked sources) and exposes build facts for `mtmegatron env`.
#include <pybind11/pybind11.h>

#include "mtm/cpu.h"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "mtmegatron native kernels (registered with torch.library on import)";
  py::dict info;
#ifdef MTM_HAVE_OPENMP
  info["openmp"] = true;
#else
  info["openmp"] = false;
#endif
#ifdef MTM_WITH_CUDA
  info["cuda"] = true;
#else
  info["cuda"] = false;
#endif
  info["compiler"] = __VERSION__;
  info["cpu_isa"] = mtm::cpu::isa();
  m.attr("build_info") = info;
}
