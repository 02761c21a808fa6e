// A Device handed from one extension to another through a capsule, so the simulated device (the
// test-only fastpath.runtime._hostdispatch_sim) drives the engine of any host-dispatch extension
// without being compiled into it. The object's __fastpath_device__() returns the capsule. Both
// sides must be built from the same headers: the capsule's name carries an ABI number, to be
// raised whenever Device's interface changes.
#pragma once

#include <Python.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <string>
#include <utility>

#include "fastpath/device.hpp"

namespace fastpath::hostdispatch {

namespace py = pybind11;

inline constexpr const char* kDeviceCapsule = "fastpath.hostdispatch.Device/abi-1";
inline constexpr const char* kDeviceMethod = "__fastpath_device__";

// The capsule owns a reference to the device.
inline py::object device_capsule(std::shared_ptr<Device> device) {
  auto* held = new std::shared_ptr<Device>(std::move(device));
  PyObject* capsule = PyCapsule_New(held, kDeviceCapsule, [](PyObject* self) {
    delete static_cast<std::shared_ptr<Device>*>(PyCapsule_GetPointer(self, kDeviceCapsule));
  });
  if (capsule == nullptr) {
    delete held;
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::object>(capsule);
}

// The device `spec` hands over, or null when it offers none.
inline std::shared_ptr<Device> device_of(const py::handle& spec) {
  if (!py::hasattr(spec, kDeviceMethod)) return nullptr;
  py::object capsule = spec.attr(kDeviceMethod)();
  void* held = PyCapsule_GetPointer(capsule.ptr(), kDeviceCapsule);
  if (held == nullptr) {
    PyErr_Clear();
    throw py::type_error(std::string(py::repr(spec)) + "." + kDeviceMethod + "() did not return a '" +
                         kDeviceCapsule + "' capsule: it was built from other fastpath headers");
  }
  return *static_cast<std::shared_ptr<Device>*>(held);
}

}  // namespace fastpath::hostdispatch
