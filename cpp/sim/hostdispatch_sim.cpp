// fastpath.runtime._hostdispatch_sim: the simulated device, for tests and benchmarks without a
// GPU, built only with FASTPATH_BUILD_SIM (editable installs). SimDevice (what it "supports"),
// SimStream and SimGraph drive every backend's real protocol; any host-dispatch extension's
// Engine takes a SimDevice through its __fastpath_device__ capsule (py_device.hpp).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <stdexcept>
#include <utility>

#include "fastpath/py_device.hpp"
#include "sim_device.hpp"

namespace fastpath::hostdispatch {
namespace {

namespace py = pybind11;

struct PySimDevice {
  std::shared_ptr<SimDevice> device;
};

class PySimStream {
 public:
  explicit PySimStream(std::size_t capacity) : stream_(std::make_unique<SimStream>(capacity)) {}
  // Closing runs what is still queued; host functions there may need the GIL.
  ~PySimStream() { close(); }

  void close() {
    if (!stream_) return;
    if (PyGILState_Check()) {
      py::gil_scoped_release unlocked;
      stream_.reset();
    } else {
      stream_.reset();
    }
  }

  SimStream& get() {
    if (!stream_) throw std::runtime_error("the simulated stream is closed");
    return *stream_;
  }

 private:
  std::unique_ptr<SimStream> stream_;
};

struct PySimGraph {
  std::shared_ptr<SimGraphBody> body;
};

void throw_if_failed(const Status& st) {
  if (!st.ok()) throw std::runtime_error(st.error);
}

void define_sim_device(py::module_& m) {
  py::class_<PySimDevice>(m, "SimDevice", py::module_local(), "A CPU stand-in for a CUDA device (tests and benchmarks without a GPU).")
      .def(py::init([](bool hostfunc_v2, bool memops, bool queue, int runtime_version, int driver_version) {
             SimDeviceConfig c;
             c.hostfunc_v2 = hostfunc_v2;
             c.memops = memops;
             c.queue = queue;
             c.runtime_version = runtime_version;
             c.driver_version = driver_version;
             return PySimDevice{std::make_shared<SimDevice>(c)};
           }),
           py::kw_only(), py::arg("hostfunc_v2") = true, py::arg("memops") = true, py::arg("queue") = true,
           py::arg("runtime_version") = 13020,
           py::arg("driver_version") = 13020)
      .def(kDeviceMethod, [](const PySimDevice& d) { return device_capsule(d.device); },
           "The device as a capsule, for an extension's Engine.");
}

void define_sim_stream(py::module_& m) {
  py::class_<PySimStream>(m, "SimStream", py::module_local(), "A thread that runs enqueued operations in order, like a stream.")
      .def(py::init<std::size_t>(), py::arg("capacity") = 4096)
      .def_property_readonly("handle", [](PySimStream& s) { return s.get().handle(); })
      .def_property_readonly("executed", [](PySimStream& s) { return s.get().executed(); })
      .def(
          "busy",
          [](PySimStream& s, double seconds) {
            Status st;
            {
              py::gil_scoped_release unlocked;  // blocks while the queue is full
              st = s.get().busy(seconds);
            }
            throw_if_failed(st);
          },
          py::arg("seconds"), "Enqueue a 'kernel' that takes this long.")
      .def(
          "delay_queue_stores", [](PySimStream& s, double seconds) { s.get().delay_queue_stores(seconds); },
          py::arg("seconds"), "From now on this stream's queue-ring requests pause between claim and store.")
      .def("begin_capture", [](PySimStream& s) { return s.get().begin_capture(); })
      .def("end_capture", [](PySimStream& s) { return PySimGraph{s.get().end_capture()}; })
      .def(
          "synchronize",
          [](PySimStream& s, std::optional<double> timeout) {
            SimStream& stream = s.get();
            py::gil_scoped_release unlocked;
            return stream.synchronize(timeout ? *timeout : -1.0);
          },
          py::arg("timeout") = py::none(), "True once everything enqueued ran; False on timeout.")
      .def("close", &PySimStream::close);
}

void define_sim_graph(py::module_& m) {
  py::class_<PySimGraph>(m, "SimGraph", py::module_local(), "Operations captured on a SimStream, replayable.")
      .def(
          "replay",
          [](PySimGraph& g, PySimStream& s) {
            if (!g.body) throw std::runtime_error("the simulated graph was reset");
            SimStream& stream = s.get();
            Status st;
            {
              py::gil_scoped_release unlocked;
              st = stream.replay(g.body);
            }
            throw_if_failed(st);
          },
          py::arg("stream"))
      .def("reset", [](PySimGraph& g) { g.body.reset(); }, "Drop the graph, as destroying a CUDA graph does.")
      .def_property_readonly("num_ops", [](const PySimGraph& g) { return g.body ? g.body->ops.size() : 0; });
}

}  // namespace
}  // namespace fastpath::hostdispatch

PYBIND11_MODULE(_hostdispatch_sim, m) {
  namespace hd = fastpath::hostdispatch;
  m.doc() = "fastpath's simulated device, for host-dispatch tests without a GPU (not in the fastpath wheel)";
  hd::define_sim_device(m);
  hd::define_sim_stream(m);
  hd::define_sim_graph(m);
}
