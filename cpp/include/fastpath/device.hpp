// What the dispatch backends need from a device: stream memory operations on host flags, host
// functions, capture state, and graph-owned lifetimes. The CUDA device and the CPU simulator
// (for tests without a GPU) both implement it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "fastpath/dispatch_mode.hpp"

namespace fastpath::hostdispatch {

using StreamHandle = std::uintptr_t;  // a cudaStream_t as an integer (torch's Stream.cuda_stream)
using HostFn = void (*)(void*);

// An empty error means success; success allocates nothing.
struct Status {
  std::string error;
  bool ok() const { return error.empty(); }
  static Status success() { return {}; }
  static Status failure(std::string message) { return {std::move(message)}; }
};

struct CaptureState {
  bool capturing = false;
  std::uint64_t id = 0;  // unique per capture sequence
};

// Something a captured graph owns. The device destroys it once the graph and every executable
// instance of it are gone, possibly on a thread of its own.
class GraphOwned {
 public:
  virtual ~GraphOwned() = default;
};

// Set at interpreter exit. From then on nothing frees device memory: the CUDA runtime may be
// unloading, and the process is about to give everything back anyway.
inline std::atomic<bool>& process_exiting() {
  static std::atomic<bool> exiting{false};
  return exiting;
}

// How a stream rings the doorbell: write the request, then wait until the host has served it.
//   memops:  cuStreamWriteValue32 then cuStreamWaitValue32, two stream operations (two graph nodes).
//   batched: the same two in one cuStreamBatchMemOp (one node).
//   kernel:  one single-thread kernel stores the request and polls the flag (one node; the poll
//            runs on an SM instead of the front end).
// auto picks the first of kernel, batched, memops that passes its self-test here.
enum class Ring : int { Auto, Memops, Batched, Kernel };

inline const char* name_of(Ring r) {
  switch (r) {
    case Ring::Auto: return "auto";
    case Ring::Memops: return "memops";
    case Ring::Batched: return "batched";
    case Ring::Kernel: return "kernel";
  }
  return "?";
}

inline bool parse_ring(const std::string& text, Ring* out) {
  for (Ring r : {Ring::Auto, Ring::Memops, Ring::Batched, Ring::Kernel}) {
    if (text == name_of(r)) {
      *out = r;
      return true;
    }
  }
  return false;
}

struct RingChoice {
  Ring ring = Ring::Memops;
  std::string reason;
};

struct FlagMemory {
  void* host = nullptr;
  std::uint64_t device = 0;  // the same memory as the device addresses it
  std::size_t bytes = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual std::string name() const = 0;
  virtual Capabilities probe() = 0;
  // Host memory the stream can write and wait on; zeroed.
  virtual Status alloc_flags(std::size_t bytes, FlagMemory* out) = 0;
  virtual void free_flags(const FlagMemory& mem) = 0;
  virtual Status write_flag(StreamHandle stream, std::uint64_t addr, std::uint32_t value) = 0;
  // The stream waits until the 32-bit word at addr equals value.
  virtual Status wait_flag(StreamHandle stream, std::uint64_t addr, std::uint32_t value) = 0;
  // What `wanted` resolves to here (auto, or a ring this device cannot run), and why.
  virtual RingChoice choose_ring(Ring wanted) {
    return {Ring::Memops, std::string("this device rings with two memory operations (") + name_of(wanted) +
                              " asked)"};
  }
  // The stream requests (writes `request` at addr), then waits until the word equals `served`.
  // *requested: whether the request was enqueued, so a failed launch knows what to take back.
  virtual Status ring(StreamHandle stream, std::uint64_t addr, std::uint32_t request, std::uint32_t served,
                      Ring how, bool* requested) {
    (void)how;
    *requested = false;
    Status st = write_flag(stream, addr, request);
    if (!st.ok()) return st;
    *requested = true;
    return wait_flag(stream, addr, served);
  }
  virtual Status launch_host_func(StreamHandle stream, HostFn fn, void* data, bool spin_wait) = 0;
  virtual Status capture_state(StreamHandle stream, CaptureState* out) = 0;
  // Ties `owned` to the graph being captured on `stream`; destroys it at once on failure.
  virtual Status retain_in_capture(StreamHandle stream, std::unique_ptr<GraphOwned> owned) = 0;
  virtual Status synchronize(StreamHandle stream) = 0;
};

}  // namespace fastpath::hostdispatch
