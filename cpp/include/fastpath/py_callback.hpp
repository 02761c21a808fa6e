// A Python callable as a host callback. It takes the GIL on the dispatch thread's persistent
// thread state, and an exception it raises is kept, with its traceback, for the next check().
#pragma once

#include <Python.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "fastpath/callback.hpp"
#include "fastpath/py_gil.hpp"

namespace fastpath::hostdispatch {

// The current exception as one object with __traceback__ set; clears the error indicator.
inline PyObject* take_raised_exception() {
#if PY_VERSION_HEX >= 0x030C0000
  return PyErr_GetRaisedException();
#else
  PyObject *type = nullptr, *value = nullptr, *tb = nullptr;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  if (value != nullptr && tb != nullptr) PyException_SetTraceback(value, tb);
  Py_XDECREF(type);
  Py_XDECREF(tb);
  return value;
#endif
}

struct KeptError {
  PyObject* exception = nullptr;  // owned
  PyObject* callable = nullptr;   // owned: names the callback in the report
};

// Exceptions raised in callbacks, oldest first. Touched only with the GIL held.
class PyErrorSink {
 public:
  static constexpr std::size_t kKept = 64;  // beyond this only the count grows

  ~PyErrorSink() {
    for (KeptError& e : kept_) {
      release_py(e.exception);
      release_py(e.callable);
    }
  }

  // Takes the reference to exception.
  void keep(PyObject* exception, PyObject* callable) {
    std::lock_guard<std::mutex> lock(mu_);
    ++raised_;
    if (exception == nullptr) return;  // a failure with no exception set: counted, nothing to keep
    if (kept_.size() >= kKept) {
      Py_DECREF(exception);
      return;
    }
    Py_INCREF(callable);
    kept_.push_back({exception, callable});
  }

  // Hands over the kept errors (references included) and how many were raised in all.
  std::vector<KeptError> take(std::int64_t* raised) {
    std::lock_guard<std::mutex> lock(mu_);
    *raised = raised_;
    raised_ = 0;
    std::vector<KeptError> out;
    out.swap(kept_);
    return out;
  }

  std::int64_t pending() {
    std::lock_guard<std::mutex> lock(mu_);
    return raised_;
  }

 private:
  std::mutex mu_;
  std::vector<KeptError> kept_;
  std::int64_t raised_ = 0;
};

class PyCallback final : public Callback {
 public:
  // GIL held. Takes new references to fn and args.
  PyCallback(PyObject* fn, PyObject* args, std::shared_ptr<PyErrorSink> sink)
      : fn_(fn), args_(args), sink_(std::move(sink)) {
    Py_INCREF(fn_);
    Py_INCREF(args_);
  }

  ~PyCallback() override {
    release_py(fn_);
    release_py(args_);
  }

  void run(bool last_use) noexcept override {
    CallbackGil gil;
    if (!gil.acquired() || fn_ == nullptr) return;  // the interpreter is finalizing
    PyObject* result = PyObject_Call(fn_, args_, nullptr);
    if (result != nullptr) {
      Py_DECREF(result);
    } else {
      sink_->keep(take_raised_exception(), fn_);
    }
    if (last_use) {  // drop them while the GIL is held, rather than through the graveyard
      Py_CLEAR(fn_);
      Py_CLEAR(args_);
    }
  }

  // GIL held.
  std::string describe() const override {
    if (fn_ == nullptr) return "<callback that already ran>";
    PyObject* r = PyObject_Repr(fn_);
    if (r == nullptr) {
      PyErr_Clear();
      return "<unprintable callable>";
    }
    const char* text = PyUnicode_AsUTF8(r);
    std::string out = text != nullptr ? text : "<unprintable callable>";
    if (text == nullptr) PyErr_Clear();
    Py_DECREF(r);
    return out;
  }

 private:
  PyObject* fn_;
  PyObject* args_;
  std::shared_ptr<PyErrorSink> sink_;
};

}  // namespace fastpath::hostdispatch
