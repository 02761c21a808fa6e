// fastpath.runtime._hostdispatch: the native binding of the host-dispatch core.
#include <pybind11/pybind11.h>

#include "fastpath/cuda_probe.hpp"

namespace py = pybind11;

PYBIND11_MODULE(_hostdispatch, m) {
  m.doc() = "fastpath host dispatch (native binding; mode chosen at run time)";
  m.def("cuda_available", &fastpath::cuda_available,
        "True when a CUDA driver is loadable and a device is visible. Never called at import.");
  m.def("build_info", [] {
    py::dict d;
    d["cuda"] = fastpath::kBuiltWithCuda;
    d["cuda_runtime_build_version"] = fastpath::kCudaRuntimeBuildVersion;
    d["cudart"] = fastpath::kBuiltWithCuda ? "static" : "none";
#if defined(__clang__)
    d["compiler"] = "clang " __clang_version__;
#elif defined(__GNUC__)
    d["compiler"] = "gcc " __VERSION__;
#else
    d["compiler"] = "unknown";
#endif
    return d;
  });
  m.def("cuda_versions", [] {
    auto v = fastpath::cuda_versions();
    py::dict d;
    d["runtime"] = v.runtime;
    d["driver"] = v.driver;
    return d;
  });
}
