// The CUDA device: runtime calls for streams, pinned memory and graphs; driver calls (memory
// operations, hostfunc_v2) through entry points. probe() self-tests what it reports, once per
// device and process, so "auto" picks what actually works here.
#pragma once

#include "fastpath/cuda_probe.hpp"
#include "fastpath/device.hpp"

#if FASTPATH_WITH_CUDA
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>

#include "fastpath/doorbell_slots.hpp"
#include "fastpath/driver_entry_points.hpp"
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

// One doorbell round trip on a private stream: the stream requests, the host serves, the stream
// passes its wait. The probe answers even when the request never shows, so it cannot hang.
inline Capability self_test_memops(const DriverApi& api) {
  Capability cap;
  void* host = nullptr;
  cudaError_t e = cudaHostAlloc(&host, kFlagStride, cudaHostAllocMapped | cudaHostAllocPortable);
  if (e != cudaSuccess) return {false, cuda_failure("cudaHostAlloc(mapped)", e).error};
  auto* flag = new (host) std::atomic<std::uint32_t>(kFlagIdle);
  void* dev = nullptr;
  cudaStream_t s = nullptr;
  if ((e = cudaHostGetDevicePointer(&dev, host, 0)) != cudaSuccess ||
      (e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)) != cudaSuccess) {
    cap.reason = cuda_failure("doorbell self-test set-up", e).error;
    (void)cudaFreeHost(host);
    return cap;
  }
  const auto addr = static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(dev));
  CUresult r = api.write_value32(reinterpret_cast<CUstream>(s), addr, kFlagRequested, 0);
  if (r == CUDA_SUCCESS) r = api.wait_value32(reinterpret_cast<CUstream>(s), addr, kFlagServed, kWaitValueEq);
  bool seen = false;
  if (r == CUDA_SUCCESS) {
    const std::int64_t deadline = now_ns() + 2'000'000'000;
    while (!(seen = flag->load(std::memory_order_acquire) == kFlagRequested) && now_ns() < deadline) cpu_relax();
  }
  flag->store(kFlagServed, std::memory_order_release);
  cudaError_t last = cudaSuccess;
  const bool finished = stream_finishes(s, 2.0, &last);
  if (r != CUDA_SUCCESS) {
    cap.reason = "cuStreamWriteValue32/cuStreamWaitValue32 refused: " + api.error_text(r);
  } else if (!seen) {
    cap.reason = "self-test: the stream's flag write never reached host memory";
  } else if (!finished) {
    cap.reason = last == cudaErrorNotReady ? "self-test: the stream's wait never saw the host's flag"
                                           : cuda_failure("self-test stream", last).error;
  } else {
    cap.available = true;
    cap.reason = "stream memory operations on mapped pinned memory (self-test passed)";
  }
  if (finished || last != cudaErrorNotReady) {
    (void)cudaStreamDestroy(s);
    (void)cudaFreeHost(host);
  }  // else the stream may still touch the flag: keep both, deliberately
  return cap;
}

inline Capability self_test_hostfunc_v2(const DriverApi& api) {
  Capability cap;
  cudaStream_t s = nullptr;
  cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e != cudaSuccess) return {false, cuda_failure("hostfunc_v2 self-test set-up", e).error};
  auto* ran = new std::atomic<int>(0);  // leaked if the task never runs: it may still
  auto mark = [](void* p) { static_cast<std::atomic<int>*>(p)->store(1); };
  const CUresult r = api.launch_host_func_v2(reinterpret_cast<CUstream>(s), mark, ran, kHostTaskSpinWait);
  cudaError_t last = cudaSuccess;
  const bool finished = stream_finishes(s, 2.0, &last);
  if (r != CUDA_SUCCESS) {
    cap.reason = "cuLaunchHostFunc_v2 refused: " + api.error_text(r);
  } else if (!finished || ran->load() != 1) {
    cap.reason = "self-test: the host task did not run";
  } else {
    cap.available = true;
    cap.reason = "cuLaunchHostFunc_v2 with CU_HOST_TASK_SPINWAIT (self-test passed)";
  }
  if (finished || r != CUDA_SUCCESS) delete ran;
  (void)cudaStreamDestroy(s);
  return cap;
}

inline Capabilities probe_cuda_device(int ordinal) {
  Capabilities caps;
  const CudaVersions v = cuda_versions();
  caps.runtime_version = v.runtime;
  caps.driver_version = v.driver;
  if (!cuda_available()) {
    caps.cuda.reason = v.driver == 0 ? "no CUDA driver" : "no CUDA device visible";
    return caps;
  }
  caps.cuda = {true, "CUDA runtime " + version_text(v.runtime) + ", driver " + version_text(v.driver)};
  RelaxedCaptureMode relaxed;
  CurrentDevice on(ordinal);
  const DriverApi& api = DriverApi::get();
  if (api.write_value32 == nullptr) {
    caps.memops.reason = api.memops_why_not;
  } else {
    caps.memops = self_test_memops(api);
  }
  const int need = static_cast<int>(kHostFuncV2MinVersion);
  if (v.runtime < need || v.driver < need) {
    caps.hostfunc_v2.reason = "needs CUDA runtime and driver " + version_text(need) + " or newer (runtime " +
                              version_text(v.runtime) + ", driver " + version_text(v.driver) + ")";
    if (api.launch_host_func_v2 == nullptr) caps.hostfunc_v2.reason += "; " + api.hostfunc_v2_why_not;
  } else if (api.launch_host_func_v2 == nullptr) {
    caps.hostfunc_v2.reason = api.hostfunc_v2_why_not;
  } else {
    caps.hostfunc_v2 = self_test_hostfunc_v2(api);
  }
  return caps;
}

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int ordinal) : ordinal_(ordinal) {}

  std::string name() const override { return "cuda:" + std::to_string(ordinal_); }

  Capabilities probe() override {
    static std::mutex mu;
    static std::map<int, Capabilities> cache;
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(ordinal_);
    if (it == cache.end()) it = cache.emplace(ordinal_, probe_cuda_device(ordinal_)).first;
    return it->second;
  }

  Status alloc_flags(std::size_t bytes, FlagMemory* out) override {
    RelaxedCaptureMode relaxed;
    CurrentDevice on(ordinal_);
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

  void free_flags(const FlagMemory& mem) override {
    if (process_exiting().load()) return;
    if (cudaFreeHost(mem.host) != cudaSuccess) (void)cudaGetLastError();
  }

  Status write_flag(StreamHandle stream, std::uint64_t addr, std::uint32_t value) override {
    const DriverApi& api = DriverApi::get();
    const CUresult r = api.write_value32(as_cu(stream), static_cast<CUdeviceptr>(addr), value, 0);
    if (r == CUDA_SUCCESS) return Status::success();
    return Status::failure("cuStreamWriteValue32: " + api.error_text(r));
  }

  Status wait_flag(StreamHandle stream, std::uint64_t addr, std::uint32_t value) override {
    const DriverApi& api = DriverApi::get();
    const CUresult r = api.wait_value32(as_cu(stream), static_cast<CUdeviceptr>(addr), value, kWaitValueEq);
    if (r == CUDA_SUCCESS) return Status::success();
    return Status::failure("cuStreamWaitValue32: " + api.error_text(r));
  }

  Status launch_host_func(StreamHandle stream, HostFn fn, void* data, bool spin_wait) override {
    if (spin_wait) {
      const DriverApi& api = DriverApi::get();
      const CUresult r = api.launch_host_func_v2(as_cu(stream), fn, data, kHostTaskSpinWait);
      if (r == CUDA_SUCCESS) return Status::success();
      return Status::failure("cuLaunchHostFunc_v2: " + api.error_text(r));
    }
    const cudaError_t e = cudaLaunchHostFunc(as_rt(stream), fn, data);
    return e == cudaSuccess ? Status::success() : cuda_failure("cudaLaunchHostFunc", e);
  }

  Status capture_state(StreamHandle stream, CaptureState* out) override {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    unsigned long long id = 0;
    const cudaError_t e = cudaStreamGetCaptureInfo(as_rt(stream), &status, &id);
    if (e != cudaSuccess) return cuda_failure("cudaStreamGetCaptureInfo", e);
    if (status == cudaStreamCaptureStatusInvalidated) {
      return Status::failure("the CUDA graph capture on this stream was invalidated");
    }
    out->capturing = status == cudaStreamCaptureStatusActive;
    out->id = id;
    return Status::success();
  }

  Status retain_in_capture(StreamHandle stream, std::unique_ptr<GraphOwned> owned) override {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    unsigned long long id = 0;
    cudaGraph_t graph = nullptr;
#if CUDART_VERSION >= 13000
    cudaError_t e = cudaStreamGetCaptureInfo(as_rt(stream), &status, &id, &graph);
#else
    cudaError_t e = cudaStreamGetCaptureInfo_v2(as_rt(stream), &status, &id, &graph, nullptr, nullptr);
#endif
    if (e != cudaSuccess) return cuda_failure("cudaStreamGetCaptureInfo", e);
    if (status != cudaStreamCaptureStatusActive || graph == nullptr) {
      return Status::failure("no active CUDA graph capture on this stream");
    }
    cudaUserObject_t object = nullptr;
    e = cudaUserObjectCreate(&object, owned.get(), &destroy_owned, 1, cudaUserObjectNoDestructorSync);
    if (e != cudaSuccess) return cuda_failure("cudaUserObjectCreate", e);
    owned.release();  // the user object owns it now
    e = cudaGraphRetainUserObject(graph, object, 1, cudaGraphUserObjectMove);
    if (e != cudaSuccess) {
      Status st = cuda_failure("cudaGraphRetainUserObject", e);
      (void)cudaUserObjectRelease(object, 1);
      return st;
    }
    return Status::success();
  }

  Status synchronize(StreamHandle stream) override {
    const cudaError_t e = cudaStreamSynchronize(as_rt(stream));
    return e == cudaSuccess ? Status::success() : cuda_failure("cudaStreamSynchronize", e);
  }

 private:
  static void destroy_owned(void* p) { delete static_cast<GraphOwned*>(p); }
  static cudaStream_t as_rt(StreamHandle s) { return reinterpret_cast<cudaStream_t>(s); }
  static CUstream as_cu(StreamHandle s) { return reinterpret_cast<CUstream>(s); }

  int ordinal_;
};

}  // namespace fastpath::hostdispatch

#endif  // FASTPATH_WITH_CUDA
