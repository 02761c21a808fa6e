// The queue ring on CUDA (device.hpp says what it is): its kernel, its memory, and its self-test.
#pragma once

#include "fastpath/cuda_util.hpp"

#if FASTPATH_WITH_CUDA
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <new>
#include <string>
#include <thread>

#include "fastpath/device.hpp"
#include "fastpath/spin_util.hpp"

namespace fastpath::hostdispatch {

// One thread: claim s with a device atomic; while s is a full lap ahead of what the host consumed,
// poll the host's count (rare: the cached limit spares every other claim the PCIe read); store
// (s + 1, slot) with release at system scope; a waiting callback then polls its flag for s + 1.
// The limit is read before the claim, so the read overlaps the atomic: a stale limit is only
// lower, and lower is safe. The read is relaxed: the hazard it guards is the host's read of an old
// entry against a kernel's overwrite of it, and every link of that chain is ordered in real time
// (the host reads, then stores consumed; a kernel acquires consumed, then stores the limit; this
// kernel reads that limit, then stores with release). An acquire read measured 0.2 us slower on
// the H200, because the atomic then waits for it. Counters wrap: every comparison is a signed
// difference.
// The same kernel twice: for sm_70 on, and for sm_90 on with programmatic dependent launch, where
// it may start while the kernel before it runs and waits (griddepcontrol.wait) only before it
// touches memory, so its launch latency hides behind that kernel.
inline constexpr char kQueuePtxHeader[] = ".version 7.0\n.target sm_70\n.address_size 64\n";
inline constexpr char kQueuePtxHeaderPdl[] = ".version 7.8\n.target sm_90\n.address_size 64\n";
inline constexpr char kQueueKernelBody[] = R"PTX(
.visible .entry fastpath_doorbell_queue(.param .u64 entries, .param .u64 consumed, .param .u64 words,
                                        .param .u64 flag, .param .u32 slot, .param .u32 mask)
{
  .reg .b64 %rd<8>;
  .reg .b32 %r<12>;
  .reg .pred %p<4>;
  ld.param.u64 %rd1, [entries];
  ld.param.u64 %rd2, [consumed];
  ld.param.u64 %rd3, [words];
  ld.param.u64 %rd4, [flag];
  ld.param.u32 %r1, [slot];
  ld.param.u32 %r2, [mask];
  cvta.to.global.u64 %rd1, %rd1;
  cvta.to.global.u64 %rd2, %rd2;
  cvta.to.global.u64 %rd3, %rd3;
  cvta.to.global.u64 %rd4, %rd4;
  // PREDECESSOR
  ld.relaxed.gpu.global.u32 %r4, [%rd3+4];
  atom.global.add.u32 %r3, [%rd3], 1;
  sub.u32 %r5, %r3, %r4;
  setp.lt.s32 %p1, %r5, 0;
  @%p1 bra CLAIMED;
FULL:
  ld.acquire.sys.global.u32 %r6, [%rd2];
  add.u32 %r7, %r6, %r2;
  add.u32 %r7, %r7, 1;
  sub.u32 %r5, %r3, %r7;
  setp.ge.s32 %p2, %r5, 0;
  @%p2 bra FULL;
  st.release.gpu.global.u32 [%rd3+4], %r7;
CLAIMED:
  add.u32 %r8, %r3, 1;
  and.b32 %r9, %r3, %r2;
  mul.wide.u32 %rd5, %r9, 8;
  add.u64 %rd6, %rd1, %rd5;
  mov.b64 %rd7, {%r8, %r1};
  st.release.sys.global.u64 [%rd6], %rd7;
  and.b32 %r10, %r1, -2147483648;
  setp.eq.u32 %p3, %r10, 0;
  @%p3 bra DONE;
WAIT:
  ld.acquire.sys.global.u32 %r11, [%rd4];
  setp.ne.u32 %p3, %r11, %r8;
  @%p3 bra WAIT;
DONE:
  ret;
}
)PTX";

inline std::string queue_kernel_ptx(bool pdl) {
  std::string ptx = std::string(pdl ? kQueuePtxHeaderPdl : kQueuePtxHeader) + kQueueKernelBody;
  const std::string mark = "// PREDECESSOR";
  ptx.replace(ptx.find(mark), mark.size(), pdl ? "griddepcontrol.wait;" : "");
  return ptx;
}

struct QueueKernel {
  const void* fn = nullptr;   // a cudaKernel_t
  const void* pdl = nullptr;  // the sm_90 one, or null
  std::string why_not;

  static const QueueKernel& get() {
    static const QueueKernel k = load();
    return k;
  }

 private:
  static QueueKernel load() {
    QueueKernel k;
    k.fn = load_ptx_kernel(queue_kernel_ptx(false).c_str(), "fastpath_doorbell_queue", &k.why_not);
    std::string pdl_why_not;  // without it the plain kernel serves: programmatic launch is an extra
    if (k.fn != nullptr) k.pdl = load_ptx_kernel(queue_kernel_ptx(true).c_str(), "fastpath_doorbell_queue", &pdl_why_not);
    return k;
  }
};

// On the current device. Synchronous: call it outside any capture (a dispatcher's construction).
inline Status cuda_alloc_queue(std::uint32_t entries, QueueMemory* out) {
  Status st = check_queue_entries(entries);
  if (!st.ok()) return st;
  QueueMemory q;
  q.entries = entries;
  st = alloc_mapped(QueueMemory::host_bytes(entries), &q.host);
  if (!st.ok()) return st;
  void* words = nullptr;
  const std::uint32_t init[2] = {0, entries};  // nothing claimed; a first lap is free
  cudaError_t e = cudaSuccess;
  if ((e = cudaMalloc(&words, sizeof(init))) != cudaSuccess ||
      (e = cudaMemcpy(words, init, sizeof(init), cudaMemcpyHostToDevice)) != cudaSuccess) {
    st = cuda_failure("queue ring set-up", e);
    if (words != nullptr) (void)cudaFree(words);
    (void)cudaFreeHost(q.host.host);
    return st;
  }
  q.device_words = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(words));
  *out = q;
  return Status::success();
}

inline void cuda_free_queue(const QueueMemory& q) {
  if (q.host.host == nullptr || process_exiting().load()) return;
  if (cudaFree(reinterpret_cast<void*>(static_cast<std::uintptr_t>(q.device_words))) != cudaSuccess) {
    (void)cudaGetLastError();
  }
  if (cudaFreeHost(q.host.host) != cudaSuccess) (void)cudaGetLastError();
}

inline Status enqueue_queue(cudaStream_t stream, const QueueMemory& q, std::uint32_t slot_word, std::uint64_t flag,
                            bool pdl) {
  const QueueKernel& k = QueueKernel::get();
  if (k.fn == nullptr) return Status::failure(k.why_not);
  std::uint64_t entries = q.host.device, consumed = q.consumed_device(), words = q.device_words;
  std::uint32_t mask = q.entries - 1;
  void* args[] = {&entries, &consumed, &words, &flag, &slot_word, &mask};
  if (!pdl || k.pdl == nullptr) {
    const cudaError_t e = cudaLaunchKernel(k.fn, dim3(1), dim3(1), args, 0, stream);
    return e == cudaSuccess ? Status::success() : cuda_failure("cudaLaunchKernel(queue kernel)", e);
  }
  cudaLaunchAttribute attr = {};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(1);
  config.blockDim = dim3(1);
  config.stream = stream;
  config.attrs = &attr;
  config.numAttrs = 1;
  const cudaError_t e = cudaLaunchKernelExC(&config, k.pdl, args);
  return e == cudaSuccess ? Status::success() : cuda_failure("cudaLaunchKernelExC(queue kernel, programmatic)", e);
}

// Twenty waiting requests through an eight-entry queue on a private stream: the host serves each
// entry in order and the stream must finish. Claims past the first lap take the full-queue path,
// so both paths of the kernel are tested.
inline Capability self_test_queue(bool pdl) {
  constexpr std::uint32_t kEntries = 8, kRequests = 20;
  QueueMemory q;
  Status st = cuda_alloc_queue(kEntries, &q);
  if (!st.ok()) return {false, "queue ring self-test: " + st.error};
  auto* entries = static_cast<std::atomic<std::uint64_t>*>(q.host.host);
  auto* consumed = new (q.consumed_host()) std::atomic<std::uint32_t>(0);
  auto* flag = new (static_cast<char*>(q.consumed_host()) + 32) std::atomic<std::uint32_t>(0);
  const std::uint64_t flag_dev = q.consumed_device() + 32;
  cudaStream_t s = nullptr;
  cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e != cudaSuccess) {
    cuda_free_queue(q);
    return {false, cuda_failure("queue ring self-test set-up", e).error};
  }
  std::uint32_t launched = 0;
  while (launched < kRequests) {
    st = enqueue_queue(s, q, 3U | kQueueWaits, flag_dev, pdl);
    if (!st.ok()) break;
    ++launched;
  }
  Capability cap;
  std::uint32_t served = 0;  // every launched request, even after a refused one: none is left polling
  const std::int64_t deadline = now_ns() + 2'000'000'000;
  while (served < launched && now_ns() < deadline) {
    const std::uint64_t entry = entries[served % kEntries].load(std::memory_order_acquire);
    if (static_cast<std::uint32_t>(entry) != served + 1) {
      cpu_relax();
      continue;
    }
    if ((entry >> 32) != (3U | kQueueWaits)) {
      cap.reason = "queue ring self-test: an entry names the wrong slot";
      break;
    }
    ++served;
    flag->store(served, std::memory_order_release);
    consumed->store(served, std::memory_order_release);
  }
  cudaError_t last = cudaErrorNotReady;
  const bool finished = stream_finishes(s, 2.0, &last);
  if (!st.ok()) {
    cap.reason = "queue ring refused: " + st.error;
  } else if (cap.reason.empty() && served < kRequests) {
    cap.reason = "queue ring self-test: " + std::to_string(served) + " of " + std::to_string(kRequests) +
                 " requests reached host memory";
  } else if (cap.reason.empty() && !finished) {
    cap.reason = last == cudaErrorNotReady ? "queue ring self-test: the stream never saw the host's answers"
                                           : "queue ring self-test: " + cuda_failure("stream", last).error;
  } else if (cap.reason.empty()) {
    cap.available = true;
  }
  if (finished) {  // a stream still polling keeps its memory, deliberately
    (void)cudaStreamDestroy(s);
    cuda_free_queue(q);
  }
  return cap;
}

}  // namespace fastpath::hostdispatch

#endif  // FASTPATH_WITH_CUDA
