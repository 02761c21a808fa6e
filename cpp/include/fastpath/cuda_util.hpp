// Small CUDA runtime helpers the device and its self-tests share.
#pragma once

#include "fastpath/cuda_probe.hpp"
#include "fastpath/device.hpp"

#if FASTPATH_WITH_CUDA
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
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
