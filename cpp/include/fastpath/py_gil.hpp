// Taking the GIL from threads Python did not create (the doorbell worker, the driver's host-task
// thread) without creating a thread state per call, and dropping Python references from threads
// that do not hold the GIL.
#pragma once

#include <Python.h>

#include <atomic>
#include <mutex>
#include <vector>

namespace fastpath::hostdispatch {

inline bool py_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

inline bool py_usable() { return Py_IsInitialized() != 0 && !py_finalizing(); }

// Gives a foreign thread one thread state for its whole life: the first PyGILState_Ensure creates
// it and is never released, so later Ensure/Release pairs only take and drop the GIL. The state
// outlives the thread on purpose: deleting it at thread exit would need the GIL, which a thread
// ending during interpreter shutdown may never get; the interpreter reclaims it at exit.
class ThreadStateAnchor {
 public:
  void ensure() {
    if (anchored_ || PyGILState_GetThisThreadState() != nullptr) return;
    PyGILState_Ensure();
    PyEval_SaveThread();  // drop the GIL; the state (its Ensure count at 1) stays
    anchored_ = true;
  }

 private:
  bool anchored_ = false;
};

// Holds the GIL for one callback; acquired() is false once the interpreter is finalizing.
// The cyclic collector is off meanwhile: an allocation in the callback could otherwise collect
// any unreachable cycle there, and one holding a CUDA graph or stream frees it with a CUDA call
// on the driver's host-task thread, which CUDA forbids (seen on the H200 as an abort). The
// collection simply happens at the next allocation on another thread.
class CallbackGil {
 public:
  CallbackGil() {
    if (!py_usable()) return;
    thread_local ThreadStateAnchor anchor;
    anchor.ensure();
    state_ = PyGILState_Ensure();
    acquired_ = true;
    gc_was_enabled_ = PyGC_Disable() != 0;
  }
  ~CallbackGil() {
    if (!acquired_) return;
    if (gc_was_enabled_) PyGC_Enable();
    PyGILState_Release(state_);
  }
  CallbackGil(const CallbackGil&) = delete;
  CallbackGil& operator=(const CallbackGil&) = delete;
  bool acquired() const { return acquired_; }

 private:
  PyGILState_STATE state_ = PyGILState_UNLOCKED;
  bool acquired_ = false;
  bool gc_was_enabled_ = false;
};

// References dropped where the GIL is not held wait here until Python-facing code reaps them.
// Never while a capture is underway: the last reference to a callback can hold CUDA resources,
// and freeing them then is a CUDA call on a capturing stream. A torch pinned tensor records an
// event on each stream it was used on, and that event, captured, fails the next pinned
// allocation with "invalid argument" (seen on the H200).
class PyGraveyard {
 public:
  static PyGraveyard& instance() {
    static PyGraveyard* yard = new PyGraveyard();  // never destroyed: threads may bury until exit
    return *yard;
  }
  void bury(PyObject* o) {
    std::lock_guard<std::mutex> lock(mu_);
    dead_.push_back(o);
    nonempty_.store(true, std::memory_order_release);
  }
  // Between the start and the end of a capture (HostDispatcher.capture), reap() does nothing.
  void pause() { paused_.fetch_add(1); }
  void resume() { paused_.fetch_sub(1); }
  bool paused() const { return paused_.load() > 0; }

  // GIL held.
  void reap() {
    if (!nonempty_.load(std::memory_order_acquire) || paused()) return;
    std::vector<PyObject*> dead;
    {
      std::lock_guard<std::mutex> lock(mu_);
      dead.swap(dead_);
      nonempty_.store(false, std::memory_order_release);
    }
    for (PyObject* o : dead) Py_DECREF(o);
  }
  std::size_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return dead_.size();
  }

 private:
  std::mutex mu_;
  std::vector<PyObject*> dead_;
  std::atomic<bool> nonempty_{false};
  std::atomic<int> paused_{0};
};

// Drops a reference now if this thread holds the GIL, else defers it to the graveyard.
inline void release_py(PyObject* o) {
  if (o == nullptr) return;
  if (!Py_IsInitialized()) return;  // the interpreter is gone, and with it the object
  if (PyGILState_Check()) {
    Py_DECREF(o);
  } else {
    PyGraveyard::instance().bury(o);
  }
}

}  // namespace fastpath::hostdispatch
