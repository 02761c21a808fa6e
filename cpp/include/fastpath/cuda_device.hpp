// The CUDA device: runtime calls for streams, pinned memory and graphs; driver calls (memory
// operations, hostfunc_v2) through entry points. probe() self-tests what it reports, once per
// device and process, so "auto" picks what actually works here.
#pragma once

#include "fastpath/cuda_probe.hpp"
#include "fastpath/device.hpp"

#if FASTPATH_WITH_CUDA
#include <cuda_runtime_api.h>

#include <atomic>
#include <map>
#include <utility>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>

#include "fastpath/cuda_queue.hpp"
#include "fastpath/cuda_ring.hpp"
#include "fastpath/cuda_util.hpp"
#include "fastpath/doorbell_slots.hpp"
#include "fastpath/driver_entry_points.hpp"
#include "fastpath/spin_util.hpp"

namespace fastpath::hostdispatch {

inline Capability self_test_memops(const DriverApi& api) {
  if (api.write_value32 == nullptr) return {false, api.memops_why_not};
  Capability cap = self_test_ring(Ring::Memops);
  if (cap.available) cap.reason = "stream memory operations on mapped pinned memory (self-test passed)";
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
    return alloc_mapped(bytes, out);
  }

  void free_flags(const FlagMemory& mem) override {
    if (process_exiting().load()) return;
    RelaxedCaptureMode relaxed;  // often on the worker thread, while another thread may capture
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

  RingChoice choose_ring(Ring wanted) override {
    std::string passed_over;
    if (wanted != Ring::Auto) {
      const Capability cap = ring_capability(wanted);
      if (cap.available) return {wanted, ring_label(wanted) + ", as asked (self-test passed)"};
      passed_over = cap.reason + "; ";
    }
    // The order is the measured one: bench/hostdispatch.py times every ring side by side.
    for (Ring r : {Ring::Queue, Ring::Kernel, Ring::Batched, Ring::Memops}) {
      if (r == wanted) continue;
      const Capability cap = ring_capability(r);
      if (cap.available) return {r, passed_over + ring_label(r) + " (self-test passed)"};
      passed_over += cap.reason + "; ";
    }
    return {Ring::Memops, passed_over + "memops ring, untested"};
  }

  Status ring(StreamHandle stream, std::uint64_t addr, std::uint32_t request, std::uint32_t served, Ring how,
              bool* requested) override {
    if (how == Ring::Queue) {
      *requested = false;
      return Status::failure("the queue ring rings through ring_queue");
    }
    if (how != Ring::Kernel) return enqueue_ring(how, as_rt(stream), addr, request, served, requested);
    CurrentDevice on(ordinal_);  // a runtime launch goes to the current device; the stream is on ours
    return enqueue_ring(how, as_rt(stream), addr, request, served, requested);
  }

  Status alloc_queue(std::uint32_t entries, QueueMemory* out) override {
    RelaxedCaptureMode relaxed;
    CurrentDevice on(ordinal_);
    return cuda_alloc_queue(entries, out);
  }

  void free_queue(const QueueMemory& mem) override {
    RelaxedCaptureMode relaxed;  // often on the worker thread, while another thread may capture
    CurrentDevice on(ordinal_);
    cuda_free_queue(mem);
  }

  Status ring_queue(StreamHandle stream, const QueueMemory& q, std::uint32_t slot, bool waits,
                    std::uint64_t flag, bool programmatic) override {
    CurrentDevice on(ordinal_);
    return enqueue_queue(as_rt(stream), q, waits ? slot | kQueueWaits : slot, flag, programmatic && queue_pdl());
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
  // Self-tested once per device, ring and process; the memops ring is what probe() already tested.
  Capability ring_capability(Ring r) {
    if (r == Ring::Memops) return probe().memops;
    static std::mutex mu;
    static std::map<std::pair<int, int>, Capability> cache;
    std::lock_guard<std::mutex> lock(mu);
    const auto key = std::make_pair(ordinal_, static_cast<int>(r));
    auto it = cache.find(key);
    if (it == cache.end()) {
      RelaxedCaptureMode relaxed;
      CurrentDevice on(ordinal_);
      it = cache.emplace(key, r == Ring::Queue ? self_test_queue(false) : self_test_ring(r)).first;
    }
    return it->second;
  }

  std::string ring_label(Ring r) {
    return std::string(name_of(r)) + (r == Ring::Queue && queue_pdl() ? " ring, launched programmatically" : " ring");
  }

  // Whether the queue kernel launches with programmatic dependent launch here: sm_90 or newer,
  // and its own self-test passed. Once per device and process.
  bool queue_pdl() {
    static std::mutex mu;
    static std::map<int, bool> cache;
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(ordinal_);
    if (it == cache.end()) {
      RelaxedCaptureMode relaxed;
      CurrentDevice on(ordinal_);
      int major = 0;
      if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ordinal_) != cudaSuccess) {
        (void)cudaGetLastError();
      }
      const bool ok = major >= 9 && QueueKernel::get().pdl != nullptr && self_test_queue(true).available;
      it = cache.emplace(ordinal_, ok).first;
    }
    return it->second;
  }

  static void destroy_owned(void* p) { delete static_cast<GraphOwned*>(p); }
  static cudaStream_t as_rt(StreamHandle s) { return reinterpret_cast<cudaStream_t>(s); }
  static CUstream as_cu(StreamHandle s) { return reinterpret_cast<CUstream>(s); }

  int ordinal_;
};

}  // namespace fastpath::hostdispatch

#endif  // FASTPATH_WITH_CUDA
