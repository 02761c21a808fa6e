// Driver functions the core calls, found at run time through the runtime's versioned entry-point
// lookup (cuGetProcAddress underneath). The extension never links libcuda, and nothing here runs
// at import: the first lookup is what loads the driver.
#pragma once

#include "fastpath/cuda_probe.hpp"

#if FASTPATH_WITH_CUDA
#include <cuda.h>  // types only: CUresult, CUstream, CUdeviceptr, CUhostFn
#include <cuda_runtime_api.h>

#include <string>

namespace fastpath::hostdispatch {

// CUDA 13.2 adds cuLaunchHostFunc_v2(stream, fn, userData, syncMode) and the runtime's
// cudaLaunchHostFunc_v2; 13.0 headers declare neither, so the prototype is ours.
using PfnLaunchHostFuncV2 = CUresult(CUDAAPI*)(CUstream, CUhostFn, void*, unsigned int);
inline constexpr unsigned int kHostTaskSpinWait = 1;  // CU_HOST_TASK_SPINWAIT == cudaHostTaskSpinWait
inline constexpr unsigned int kHostFuncV2MinVersion = 13020;

using PfnStreamWriteValue32 = CUresult(CUDAAPI*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
using PfnStreamWaitValue32 = CUresult(CUDAAPI*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
using PfnGetErrorName = CUresult(CUDAAPI*)(CUresult, const char**);
using PfnStreamBatchMemOp = CUresult(CUDAAPI*)(CUstream, unsigned int, CUstreamBatchMemOpParams*, unsigned int);
inline constexpr unsigned int kMemOpsVersion = 12000;  // the v2 memory operations, CUDA 11.7+
inline constexpr unsigned int kWaitValueEq = 0x1;      // CU_STREAM_WAIT_VALUE_EQ

struct DriverSymbol {
  void* fn = nullptr;
  std::string why_not;  // set when fn is null
};

inline DriverSymbol lookup_driver_symbol(const char* symbol, unsigned int cuda_version) {
  DriverSymbol out;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  const cudaError_t err =
      cudaGetDriverEntryPointByVersion(symbol, &out.fn, cuda_version, cudaEnableDefault, &status);
#elif CUDART_VERSION >= 12000
  (void)cuda_version;  // no versioned lookup before 12.5: the default version of the symbol
  const cudaError_t err = cudaGetDriverEntryPoint(symbol, &out.fn, cudaEnableDefault, &status);
#else
  (void)cuda_version;
  const cudaError_t err = cudaErrorNotSupported;
#endif
  if (err == cudaSuccess && status == cudaDriverEntryPointSuccess && out.fn != nullptr) return out;
  (void)cudaGetLastError();  // a failed lookup must not surface later as someone else's error
  out.fn = nullptr;
  std::string what = std::string(symbol) + "@" + std::to_string(cuda_version);
  if (err != cudaSuccess) {
    out.why_not = what + ": " + cudaGetErrorString(err);
  } else if (status == cudaDriverEntryPointVersionNotSufficent) {
    out.why_not = what + ": the driver's version is not sufficient";
  } else {
    out.why_not = what + ": not found in the driver";
  }
  return out;
}

// Resolved once per process, on first use.
struct DriverApi {
  PfnStreamWriteValue32 write_value32 = nullptr;
  PfnStreamWaitValue32 wait_value32 = nullptr;
  std::string memops_why_not;
  PfnLaunchHostFuncV2 launch_host_func_v2 = nullptr;
  std::string hostfunc_v2_why_not;
  PfnGetErrorName get_error_name = nullptr;
  PfnStreamBatchMemOp batch_mem_op = nullptr;
  std::string batch_why_not;

  static const DriverApi& get() {
    static const DriverApi api = resolve();
    return api;
  }

  std::string error_text(CUresult r) const {
    const char* name = nullptr;
    if (get_error_name != nullptr && get_error_name(r, &name) == CUDA_SUCCESS && name != nullptr) {
      return name;
    }
    return "CUresult " + std::to_string(static_cast<int>(r));
  }

 private:
  static DriverApi resolve() {
    DriverApi api;
    api.get_error_name = reinterpret_cast<PfnGetErrorName>(lookup_driver_symbol("cuGetErrorName", 6000).fn);
    const DriverSymbol write = lookup_driver_symbol("cuStreamWriteValue32", kMemOpsVersion);
    const DriverSymbol wait = lookup_driver_symbol("cuStreamWaitValue32", kMemOpsVersion);
    if (write.fn != nullptr && wait.fn != nullptr) {
      api.write_value32 = reinterpret_cast<PfnStreamWriteValue32>(write.fn);
      api.wait_value32 = reinterpret_cast<PfnStreamWaitValue32>(wait.fn);
    } else {
      api.memops_why_not = write.fn == nullptr ? write.why_not : wait.why_not;
    }
    const DriverSymbol batch = lookup_driver_symbol("cuStreamBatchMemOp", kMemOpsVersion);
    api.batch_mem_op = reinterpret_cast<PfnStreamBatchMemOp>(batch.fn);
    api.batch_why_not = batch.why_not;
    const DriverSymbol v2 = lookup_driver_symbol("cuLaunchHostFunc_v2", kHostFuncV2MinVersion);
    api.launch_host_func_v2 = reinterpret_cast<PfnLaunchHostFuncV2>(v2.fn);
    api.hostfunc_v2_why_not = v2.why_not;
    return api;
  }
};

}  // namespace fastpath::hostdispatch

#endif  // FASTPATH_WITH_CUDA
