// What the dispatch backends need from a device: stream memory operations on host flags, host
// functions, capture state, and graph-owned lifetimes. The CUDA device and the CPU simulator
// (cpp/sim, for tests without a GPU) both implement it.
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
//   queue:   one single-thread kernel claims a sequence number with a device atomic and appends
//            (sequence, slot) to a queue in host memory; the host serves the queue in order. A
//            waiting callback then polls its flag for its sequence number; a posted one does not
//            wait at all. The only ring that can post.
// auto picks the first of queue, kernel, batched, memops that passes its self-test here.
enum class Ring : int { Auto, Memops, Batched, Kernel, Queue };

inline const char* name_of(Ring r) {
  switch (r) {
    case Ring::Auto: return "auto";
    case Ring::Memops: return "memops";
    case Ring::Batched: return "batched";
    case Ring::Kernel: return "kernel";
    case Ring::Queue: return "queue";
  }
  return "?";
}

inline bool parse_ring(const std::string& text, Ring* out) {
  for (Ring r : {Ring::Auto, Ring::Memops, Ring::Batched, Ring::Kernel, Ring::Queue}) {
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

// The queue ring's memory. Host memory the device writes: `entries` 64-bit entries, then the
// host's consumed count on a cache line of its own. Device memory: the claim counter, and the
// claim limit below which a claimed entry is known to be free (consumed + entries, as last read).
struct QueueMemory {
  FlagMemory host;
  std::uint64_t device_words = 0;  // {counter, limit}: two 32-bit words the device alone touches
  std::uint32_t entries = 0;       // a power of two
  std::uint64_t consumed_device() const { return host.device + entries * 8ULL; }
  void* consumed_host() const { return static_cast<char*>(host.host) + entries * 8ULL; }
  static std::size_t host_bytes(std::uint32_t entries) { return entries * 8ULL + 64; }
};

inline Status check_queue_entries(std::uint32_t entries) {
  if (entries >= 8 && (entries & (entries - 1)) == 0) return Status::success();
  return Status::failure("queue_entries must be a power of two of at least 8, not " + std::to_string(entries));
}

// Queue entry: the low word is the sequence number (claim + 1), the high word the slot; the
// slot's top bit says the stream waits for it.
inline constexpr std::uint32_t kQueueWaits = 0x80000000U;

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
  // The queue ring: claims a sequence number and appends (seq, slot | waits) to the queue; with
  // waits, the stream then waits until the word at flag equals seq.
  virtual Status alloc_queue(std::uint32_t entries, QueueMemory* out) {
    (void)entries;
    (void)out;
    return Status::failure("this device has no queue ring");
  }
  virtual void free_queue(const QueueMemory& mem) { (void)mem; }
  // programmatic: launch it so that it may start while the work before it runs, where the device can.
  virtual Status ring_queue(StreamHandle stream, const QueueMemory& q, std::uint32_t slot, bool waits,
                            std::uint64_t flag, bool programmatic) {
    (void)programmatic;
    (void)stream;
    (void)q;
    (void)slot;
    (void)waits;
    (void)flag;
    return Status::failure("this device has no queue ring");
  }
  virtual Status launch_host_func(StreamHandle stream, HostFn fn, void* data, bool spin_wait) = 0;
  virtual Status capture_state(StreamHandle stream, CaptureState* out) = 0;
  // Ties `owned` to the graph being captured on `stream`; destroys it at once on failure.
  virtual Status retain_in_capture(StreamHandle stream, std::unique_ptr<GraphOwned> owned) = 0;
  virtual Status synchronize(StreamHandle stream) = 0;
};

}  // namespace fastpath::hostdispatch
