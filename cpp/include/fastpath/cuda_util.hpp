// Small CUDA runtime helpers the device and its self-tests share.
#pragma once

#include "fastpath/cuda_probe.hpp"
#include "fastpath/device.hpp"

#if FASTPATH_WITH_CUDA
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>

#include "fastpath/spin_util.hpp"

namespace fastpath::hostdispatch {

inline Status cuda_failure(const char* what, cudaError_t e) {
  (void)cudaGetLastError();  // ours alone: keep it from surfacing in someone else's check
  return Status::failure(std::string(what) + ": " + cudaGetErrorString(e));
}

// Lets this thread make calls that a global-mode capture on another stream would forbid.
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() { (void)cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCaptureMode() { (void)cudaThreadExchangeStreamCaptureMode(&mode_); }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

class CurrentDevice {
 public:
  explicit CurrentDevice(int ordinal) {
    if (cudaGetDevice(&previous_) == cudaSuccess && previous_ != ordinal) {
      changed_ = cudaSetDevice(ordinal) == cudaSuccess;
    }
  }
  ~CurrentDevice() {
    if (changed_) (void)cudaSetDevice(previous_);
  }
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

// Zeroed pinned host memory the device can address (flags, queues); on the current device.
inline Status alloc_mapped(std::size_t bytes, FlagMemory* out) {
  void* host = nullptr;
  cudaError_t e = cudaHostAlloc(&host, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
  if (e != cudaSuccess) return cuda_failure("cudaHostAlloc(mapped, portable)", e);
  std::memset(host, 0, bytes);
  void* dev = nullptr;
  e = cudaHostGetDevicePointer(&dev, host, 0);
  if (e != cudaSuccess) {
    (void)cudaFreeHost(host);
    return cuda_failure("cudaHostGetDevicePointer", e);
  }
  *out = {host, static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(dev)), bytes};
  return Status::success();
}

// One kernel of a PTX module, JIT-compiled by the driver, so the extension needs no CUDA compiler.
// The library stays loaded for the process; it is context-independent, so one serves every device.
inline const void* load_ptx_kernel(const char* ptx, const char* name, std::string* why_not) {
#if CUDART_VERSION >= 12050
  cudaLibrary_t lib = nullptr;
  cudaError_t e = cudaLibraryLoadData(&lib, ptx, nullptr, nullptr, 0, nullptr, nullptr, 0);
  if (e != cudaSuccess) {
    *why_not = cuda_failure((std::string("cudaLibraryLoadData(") + name + ")").c_str(), e).error;
    return nullptr;
  }
  cudaKernel_t kernel = nullptr;
  e = cudaLibraryGetKernel(&kernel, lib, name);
  if (e != cudaSuccess) {
    *why_not = cuda_failure("cudaLibraryGetKernel", e).error;
    return nullptr;
  }
  return reinterpret_cast<const void*>(kernel);  // a cudaKernel_t, which cudaLaunchKernel takes
#else
  (void)ptx;
  *why_not = std::string(name) + " needs a CUDA 12.5 or newer runtime to load";
  return nullptr;
#endif
}

// Polls a stream until its work is done or timeout_s passes.
inline bool stream_finishes(cudaStream_t s, double timeout_s, cudaError_t* last) {
  const std::int64_t deadline = now_ns() + static_cast<std::int64_t>(timeout_s * 1e9);
  for (;;) {
    *last = cudaStreamQuery(s);
    if (*last != cudaErrorNotReady) return *last == cudaSuccess;
    if (now_ns() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

}  // namespace fastpath::hostdispatch

#endif  // FASTPATH_WITH_CUDA
