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
  virtual Status launch_host_func(StreamHandle stream, HostFn fn, void* data, bool spin_wait) = 0;
  virtual Status capture_state(StreamHandle stream, CaptureState* out) = 0;
  // Ties `owned` to the graph being captured on `stream`; destroys it at once on failure.
  virtual Status retain_in_capture(StreamHandle stream, std::unique_ptr<GraphOwned> owned) = 0;
  virtual Status synchronize(StreamHandle stream) = 0;
};

}  // namespace fastpath::hostdispatch
