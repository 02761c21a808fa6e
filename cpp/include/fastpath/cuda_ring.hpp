// How a CUDA stream rings the doorbell with a flag: the memops, batched and kernel rings of the
// four device.hpp names (the queue ring is cuda_queue.hpp's), and the self-test that proves a ring
// works on this device before "auto" picks it.
#pragma once

#include "fastpath/cuda_util.hpp"

#if FASTPATH_WITH_CUDA
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <new>
#include <chrono>
#include <string>
#include <thread>

#include "fastpath/doorbell_slots.hpp"
#include "fastpath/driver_entry_points.hpp"

namespace fastpath::hostdispatch {

// One thread stores the request (release, system scope), then polls until the host has served it
// (acquire, system scope). Measured on the H200, acquire polls beat relaxed polls plus one trailing
// fence (3.6 vs 4.1 us a round trip). PTX, so the extension needs no CUDA compiler: the driver JITs it.
inline constexpr char kRingKernelPtx[] = R"PTX(
.version 7.0
.target sm_70
.address_size 64

.visible .entry fastpath_doorbell_ring(.param .u64 flag, .param .u32 request, .param .u32 served)
{
  .reg .b64 %rd<2>;
  .reg .b32 %r<4>;
  .reg .pred %p<2>;
  ld.param.u64 %rd1, [flag];
  ld.param.u32 %r1, [request];
  ld.param.u32 %r2, [served];
  cvta.to.global.u64 %rd1, %rd1;
  st.release.sys.global.u32 [%rd1], %r1;
WAIT:
  ld.acquire.sys.global.u32 %r3, [%rd1];
  setp.ne.u32 %p1, %r3, %r2;
  @%p1 bra WAIT;
  ret;
}
)PTX";

// Loaded once per process.
struct RingKernel {
  const void* fn = nullptr;
  std::string why_not;

  static const RingKernel& get() {
    static const RingKernel k = [] {
      RingKernel r;
      r.fn = load_ptx_kernel(kRingKernelPtx, "fastpath_doorbell_ring", &r.why_not);
      return r;
    }();
    return k;
  }
};

inline Status enqueue_ring(Ring how, cudaStream_t stream, std::uint64_t addr, std::uint32_t request,
                           std::uint32_t served, bool* requested) {
  *requested = false;
  const DriverApi& api = DriverApi::get();
  const auto cu_stream = reinterpret_cast<CUstream>(stream);
  const auto dev_addr = static_cast<CUdeviceptr>(addr);
  switch (how) {
    case Ring::Kernel: {
      const RingKernel& k = RingKernel::get();
      if (k.fn == nullptr) return Status::failure(k.why_not);
      void* args[] = {&addr, &request, &served};
      const cudaError_t e = cudaLaunchKernel(k.fn, dim3(1), dim3(1), args, 0, stream);
      if (e != cudaSuccess) return cuda_failure("cudaLaunchKernel(ring kernel)", e);
      *requested = true;
      return Status::success();
    }
    case Ring::Batched: {
      if (api.batch_mem_op == nullptr) return Status::failure(api.batch_why_not);
      CUstreamBatchMemOpParams ops[2] = {};
      ops[0].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
      ops[0].writeValue.address = dev_addr;
      ops[0].writeValue.value = request;
      ops[1].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
      ops[1].waitValue.address = dev_addr;
      ops[1].waitValue.value = served;
      ops[1].waitValue.flags = kWaitValueEq;
      const CUresult r = api.batch_mem_op(cu_stream, 2, ops, 0);
      if (r != CUDA_SUCCESS) return Status::failure("cuStreamBatchMemOp: " + api.error_text(r));
      *requested = true;
      return Status::success();
    }
    case Ring::Queue:
      return Status::failure("the queue ring has a protocol of its own (cuda_queue.hpp)");
    case Ring::Auto:  // resolved by choose_ring before any launch; memops is the safe reading
    case Ring::Memops: {
      if (api.write_value32 == nullptr) return Status::failure(api.memops_why_not);
      CUresult r = api.write_value32(cu_stream, dev_addr, request, 0);
      if (r != CUDA_SUCCESS) return Status::failure("cuStreamWriteValue32: " + api.error_text(r));
      *requested = true;
      r = api.wait_value32(cu_stream, dev_addr, served, kWaitValueEq);
      if (r != CUDA_SUCCESS) return Status::failure("cuStreamWaitValue32: " + api.error_text(r));
      return Status::success();
    }
  }
  return Status::failure("unknown ring");
}

// One doorbell round trip on a private stream: the stream requests, the host serves, the stream
// passes its wait. The host answers even when the request never shows, so the probe cannot hang
// on the host; a stream that never finishes keeps its flag, deliberately.
inline Capability self_test_ring(Ring how) {
  Capability cap;
  FlagMemory mem;
  Status alloc = alloc_mapped(kFlagStride, &mem);
  if (!alloc.ok()) return {false, "doorbell self-test set-up: " + alloc.error};
  void* host = mem.host;
  auto* flag = new (host) std::atomic<std::uint32_t>(kFlagIdle);
  cudaStream_t s = nullptr;
  if (const cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); e != cudaSuccess) {
    cap.reason = cuda_failure("doorbell self-test set-up", e).error;
    (void)cudaFreeHost(host);
    return cap;
  }
  bool requested = false;
  const std::uint64_t addr = mem.device;
  const Status st = enqueue_ring(how, s, addr, kFlagRequested, kFlagServed, &requested);
  bool seen = false;
  if (st.ok()) {
    const std::int64_t deadline = now_ns() + 2'000'000'000;
    while (!(seen = flag->load(std::memory_order_acquire) == kFlagRequested) && now_ns() < deadline) cpu_relax();
  }
  flag->store(kFlagServed, std::memory_order_release);
  // A request that lands after the answer would overwrite it: answer again until the stream is done.
  cudaError_t last = cudaErrorNotReady;
  bool finished = false;
  for (const std::int64_t deadline = now_ns() + 2'000'000'000; now_ns() < deadline;) {
    last = cudaStreamQuery(s);
    if (last != cudaErrorNotReady) {
      finished = last == cudaSuccess;
      break;
    }
    if (flag->load(std::memory_order_acquire) == kFlagRequested) flag->store(kFlagServed, std::memory_order_release);
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  const std::string what = std::string(name_of(how)) + " ring";
  if (!st.ok()) {
    cap.reason = what + " refused: " + st.error;
  } else if (!seen) {
    cap.reason = what + " self-test: the stream's request never reached host memory";
  } else if (!finished) {
    cap.reason = last == cudaErrorNotReady ? what + " self-test: the stream never saw the host's answer"
                                           : what + " self-test: " + cuda_failure("stream", last).error;
  } else {
    cap.available = true;
  }
  if (finished || last != cudaErrorNotReady) {
    (void)cudaStreamDestroy(s);
    (void)cudaFreeHost(host);
  }
  return cap;
}

}  // namespace fastpath::hostdispatch

#endif  // FASTPATH_WITH_CUDA
