// What CUDA this process can use, asked without loading the driver at import.
// The runtime is linked statically; its first call is what loads libcuda.
#pragma once

#ifndef FASTPATH_WITH_CUDA
#define FASTPATH_WITH_CUDA 0
#endif

#if FASTPATH_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace fastpath {

inline constexpr bool kBuiltWithCuda = FASTPATH_WITH_CUDA != 0;

// Compile-time runtime version, e.g. 13000; 0 without CUDA.
inline constexpr int kCudaRuntimeBuildVersion =
#if FASTPATH_WITH_CUDA
    CUDART_VERSION;
#else
    0;
#endif

struct CudaVersions {
  int runtime = 0;  // 0 when unknown
  int driver = 0;   // 0 when no driver is loadable
};

inline CudaVersions cuda_versions() {
  CudaVersions v;
#if FASTPATH_WITH_CUDA
  if (cudaRuntimeGetVersion(&v.runtime) != cudaSuccess) v.runtime = 0;
  if (cudaDriverGetVersion(&v.driver) != cudaSuccess) v.driver = 0;
#endif
  return v;
}

// True when a driver is present and at least one device is visible.
inline bool cuda_available() {
#if FASTPATH_WITH_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return false;
  }
  return count > 0;
#else
  return false;
#endif
}

}  // namespace fastpath
