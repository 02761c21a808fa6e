// The Python-facing engine: device resolution, launches that release the GIL, kept errors, and
// reports as plain dicts.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "fastpath/cuda_device.hpp"
#include "fastpath/cuda_probe.hpp"
#include "fastpath/engine.hpp"
#include "fastpath/py_callback.hpp"
#include "fastpath/py_device.hpp"

namespace fastpath::hostdispatch {

namespace py = pybind11;

struct DeviceChoice {
  std::shared_ptr<Device> device;  // null: run inline
  std::string no_device_reason;
};

inline DeviceChoice resolve_device(const py::handle& spec) {
  if (spec.is_none()) return {nullptr, "CPU execution"};
  if (std::shared_ptr<Device> handed = device_of(spec)) return {std::move(handed), ""};
  const std::string s = py::str(spec);
  if (s == "cpu") return {nullptr, "CPU execution"};
  if (s == "cuda" || s.rfind("cuda:", 0) == 0) {
#if FASTPATH_WITH_CUDA
    int ordinal = -1;
    if (s.size() > 5) ordinal = std::stoi(s.substr(5));
    if (!cuda_available()) return {nullptr, cuda_versions().driver == 0 ? "no CUDA driver" : "no CUDA device visible"};
    if (ordinal < 0 && cudaGetDevice(&ordinal) != cudaSuccess) ordinal = 0;
    return {std::make_shared<CudaDevice>(ordinal), ""};
#else
    return {nullptr, "this extension was built without CUDA"};
#endif
  }
  throw py::value_error("device must be 'cuda', 'cuda:N', 'cpu', None or a SimDevice, not " +
                        std::string(py::repr(spec)));
}

inline py::dict capability_dict(const Capability& c) {
  py::dict d;
  d["available"] = c.available;
  d["reason"] = c.reason;
  return d;
}

inline py::dict capabilities_dict(const Capabilities& caps) {
  py::dict d;
  d["cuda"] = capability_dict(caps.cuda);
  d["hostfunc_v2"] = capability_dict(caps.hostfunc_v2);
  d["memops"] = capability_dict(caps.memops);
  d["runtime_version"] = caps.runtime_version;
  d["driver_version"] = caps.driver_version;
  return d;
}

struct EngineSettings {
  EngineOptions options;
  bool hold_gil_during_launch = false;  // test hook: the launch that deadlocked TensorRT-LLM
};

class PyEngine {
 public:
  template <class Policy>
  PyEngine(const EngineSettings& settings, const py::handle& device_spec, Policy policy)
      : hold_gil_(settings.hold_gil_during_launch), errors_(std::make_shared<PyErrorSink>()) {
    DeviceChoice choice = resolve_device(device_spec);
    py::gil_scoped_release unlocked;  // probing self-tests the device
    engine_ = Engine::create(settings.options, std::move(choice.device), choice.no_device_reason, policy);
  }

  ~PyEngine() {
    for (std::size_t i = 0; i < paused_for_.size(); ++i) PyGraveyard::instance().resume();
  }
  PyEngine(const PyEngine&) = delete;
  PyEngine& operator=(const PyEngine&) = delete;

  void launch_python(StreamHandle stream, const py::object& fn, const py::args& args, bool wait) {
    if (!PyCallable_Check(fn.ptr())) {
      throw py::type_error("a host callback must be callable, not " + std::string(py::repr(fn)));
    }
    launch(stream, std::make_shared<PyCallback>(fn.ptr(), args.ptr(), errors_), wait);
  }

  // wait=false posts it: the stream does not wait for it where the backend can post (info's "posts").
  void launch(StreamHandle stream, CallbackPtr cb, bool wait = true) {
    cb->set_posted(!wait);
    Status st;
    bool captured = false;
    if (hold_gil_) {
      st = engine_->launch(stream, std::move(cb), &captured);
    } else {
      py::gil_scoped_release unlocked;
      st = engine_->launch(stream, std::move(cb), &captured);
    }
    if (!st.ok()) throw std::runtime_error(st.error);
    if (!captured) PyGraveyard::instance().reap();  // see PyGraveyard: never into a capture
  }

  // The capture running on `stream`, if any; reaping pauses from the first call for a capture
  // until take_capture of it.
  py::object capture_id(StreamHandle stream) {
    auto id = engine_->capture_id(stream);
    if (!id) return py::none();
    std::lock_guard<std::mutex> lock(paused_mu_);
    if (paused_for_.insert(*id).second) PyGraveyard::instance().pause();
    return py::int_(*id);
  }

  std::int64_t take_capture(std::uint64_t id) {
    {
      std::lock_guard<std::mutex> lock(paused_mu_);
      if (paused_for_.erase(id) > 0) PyGraveyard::instance().resume();
    }
    return engine_->take_capture(id);
  }

  void announce(std::int64_t callbacks) {
    PyGraveyard::instance().reap();
    engine_->announce(callbacks);
  }

  void synchronize(StreamHandle stream) {
    Status st;
    {
      py::gil_scoped_release unlocked;
      st = engine_->synchronize(stream);
    }
    if (!st.ok()) throw std::runtime_error(st.error);
  }

  // [(exception, callable), ...] oldest first, and how many callbacks raised in all.
  py::tuple take_errors() {
    PyGraveyard::instance().reap();
    std::int64_t raised = 0;
    std::vector<KeptError> kept = errors_->take(&raised);
    py::list out;
    for (KeptError& e : kept) {
      out.append(py::make_tuple(py::reinterpret_steal<py::object>(e.exception),
                                py::reinterpret_steal<py::object>(e.callable)));
    }
    return py::make_tuple(out, raised);
  }

  py::dict shutdown(double timeout_s) {
    ShutdownOutcome out;
    {
      py::gil_scoped_release unlocked;  // pending Python callbacks need the GIL to finish
      out = engine_->shutdown(std::chrono::nanoseconds(static_cast<std::int64_t>(timeout_s * 1e9)));
    }
    PyGraveyard::instance().reap();
    py::list not_run;
    for (const CallbackPtr& cb : out.not_run) not_run.append(cb->describe());
    py::dict d;
    d["drained"] = out.drained;
    d["not_run"] = not_run;
    d["graph_callbacks_not_run"] = out.graph_callbacks_not_run;
    d["graph_callbacks_alive"] = out.graph_callbacks_alive;
    d["still_running"] = out.still_running;
    d["waited_s"] = out.waited_s;
    return d;
  }

  py::dict info() {
    PyGraveyard::instance().reap();
    const Selection& sel = engine_->selection();
    const BackendStats s = engine_->stats();
    py::dict d;
    d["mode"] = name_of(sel.mode);
    d["on_unsupported"] = name_of(sel.on_unsupported);
    d["backend"] = name_of(sel.backend);
    d["reason"] = sel.reason;
    d["fallback"] = sel.fallback.empty() ? py::object(py::none()) : py::object(py::str(sel.fallback));
    d["device"] = engine_->device_name();
    d["capabilities"] = capabilities_dict(engine_->capabilities());
    d["launched"] = s.launched;
    d["completed"] = s.completed;
    d["discarded"] = s.discarded;
    d["unannounced"] = s.unannounced;
    d["outstanding_eager"] = s.outstanding_eager;
    d["outstanding_graph"] = s.outstanding_graph;
    d["graph_callbacks_alive"] = s.graph_callbacks_alive;
    d["slots_in_use"] = s.slots_in_use;
    d["slot_limit"] = s.slot_limit;
    d["stream_slots"] = s.stream_slots;
    d["graph_slots"] = s.graph_slots;
    d["worker_state"] = s.worker_state;
    d["worker_cpu_ns"] = s.worker_cpu_ns;
    d["worker_wakeups"] = s.worker_wakeups;
    d["worker_os_id"] = s.worker_os_id;
    d["ring"] = s.ring;
    d["ring_reason"] = s.ring_reason;
    d["posts"] = s.posts;
    d["errors_pending"] = errors_->pending();
    return d;
  }

  const Selection& selection() const { return engine_->selection(); }
  bool has_device() const { return engine_->has_device(); }

 private:
  bool hold_gil_;
  std::shared_ptr<PyErrorSink> errors_;
  std::mutex paused_mu_;
  std::set<std::uint64_t> paused_for_;  // captures that paused reaping and have not been taken
  std::unique_ptr<Engine> engine_;
};

}  // namespace fastpath::hostdispatch
