// The flight recorder's light record in C++ (part of layerscope's native module; see
// capture/flight_scopes.py): the forward marks, and the backward starts.
//
// Forward marks: flight_mark(code) appends (steady clock ns, code, thread) to a buffer, and
// flight_after(args, output), called when a call has returned, hooks its output's autograd node.
// Both are plain CPython functions (METH_O, METH_FASTCALL), not pybind11 ones: they run twice per
// module call, and argument conversion would cost more than their work. They run with the GIL held
// (only Python calls them), which guards the forward buffer; the step's marks are handed over as
// bytes (flight_take_forward), one array per step instead of a Python tuple per mark.
//
// The recorder learns when each module call's backward starts from a pre-hook on the autograd node
// that made the call's output. A Python pre-hook costs what the engine pays to call Python for every
// such node of every step (the GIL, the gradients wrapped as Python tensors); this one is a C++
// FunctionPreHook: it appends (steady clock ns, call) to a buffer and hands the gradients back
// unchanged. The first of them in a backward pass queues an engine callback that marks the pass's end
// (call -1). The clock is the one Python's time.perf_counter_ns reads on Linux (CLOCK_MONOTONIC), so
// the forward marks Python takes and these events share one timeline.
//
// A hook made for one step does nothing once the recorder has moved on (a graph kept alive with
// retain_graph), or once it stopped: each knows its step's serial and checks the recorder's. Serials
// are unique in the process (every recorder draws them from one counter), so a graph of an earlier
// recorder never records into a later one.

#include <ATen/core/grad_mode.h>
#include <Python.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/python_variable.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace py = pybind11;

namespace layerscope_shapes {
void register_functions(py::module_& m);  // native_shapes.cpp: registered with the flight recorder's
}

namespace layerscope_flight {
namespace {

std::mutex events_lock;
std::vector<int64_t> events;  // (time ns, call) pairs; call -1: a backward pass ended
std::atomic<int64_t> current_serial{-1};  // the recorder's step serial; -1: not recording
std::atomic<bool> pass_open{false};
std::vector<int64_t> forward_marks;  // (time ns, code, thread) triples; guarded by the GIL

constexpr int64_t PASS_END = -1;
constexpr int64_t PASS_START = -2;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void record(int64_t call) {
  const int64_t at = now_ns();
  std::lock_guard<std::mutex> guard(events_lock);
  events.push_back(at);
  events.push_back(call);
}

// The first event of a backward pass queues the engine callback that marks the pass's end.
void open_pass() {
  if (!pass_open.exchange(true)) {
    torch::autograd::Engine::get_default_engine().queue_callback([] {
      pass_open.store(false);
      if (current_serial.load(std::memory_order_relaxed) >= 0) {
        record(PASS_END);
      }
    });
  }
}

struct BackwardStart : torch::autograd::FunctionPreHook {
  BackwardStart(int64_t serial, int64_t call) : serial_(serial), call_(call) {}

  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    if (current_serial.load(std::memory_order_relaxed) == serial_) {
      record(call_);
      open_pass();
    }
    return grads;
  }

  // Compiled autograd asks each hook to register itself with the graph it compiles; this one stays
  // out (a compiled backward records no starts) rather than fail the user's backward().
  void compiled_args(torch::dynamo::autograd::CompiledNodeArgs& /*args*/) const override {}

  int64_t serial_;
  int64_t call_;
};

// Hook the autograd node of `tensor` (its grad_fn): the call `call` of step `serial` starts its
// backward when that node runs. False when the tensor has no node, or when the node is one of the
// call's tensor arguments' (the call made none of its own: it returned an input).
bool hook_node(PyObject* tensor, PyObject* args, int64_t serial, int64_t call) {
  const auto& node = THPVariable_Unpack(tensor).grad_fn();
  if (!node) {
    return false;
  }
  const Py_ssize_t n = PyTuple_GET_SIZE(args);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* arg = PyTuple_GET_ITEM(args, i);
    if (THPVariable_Check(arg) && THPVariable_Unpack(arg).grad_fn().get() == node.get()) {
      return false;
    }
  }
  node->add_pre_hook(std::make_unique<BackwardStart>(serial, call));
  return true;
}

bool flight_hook(py::handle tensor, py::tuple args, int64_t serial, int64_t call) {
  if (!THPVariable_Check(tensor.ptr())) {
    return false;
  }
  return hook_node(tensor.ptr(), args.ptr(), serial, call);
}

bool tracked(PyObject* item) {
  return THPVariable_Check(item) && THPVariable_Unpack(item).requires_grad();
}

// The first tensor of `output` autograd tracks: the output itself, or one level into a tuple, list
// or dict (its values(), as Python's `_output_tensor`); nullptr for none. A new reference (the
// values of a dict are a new list).
PyObject* output_tensor(PyObject* output) {
  if (THPVariable_Check(output)) {
    if (!tracked(output)) {
      return nullptr;
    }
    Py_INCREF(output);
    return output;
  }
  PyObject* items = nullptr;
  if (PyDict_Check(output)) {
    items = PyMapping_Values(output);  // values(): a dict subclass's own order
    if (items == nullptr) {
      PyErr_Clear();
      return nullptr;
    }
  } else if (PyTuple_Check(output) || PyList_Check(output)) {
    Py_INCREF(output);
    items = output;
  } else {
    return nullptr;
  }
  PyObject* found = nullptr;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(items);
  for (Py_ssize_t i = 0; i < n && found == nullptr; ++i) {
    PyObject* item = PySequence_Fast_ITEMS(items)[i];
    if (tracked(item)) {
      Py_INCREF(item);
      found = item;
    }
  }
  Py_DECREF(items);
  return found;
}

// A forward mark (flight_mark's and flight_call's work): false when it could not be recorded (a
// Python exception is set).
bool add_mark(int64_t code) {
  try {
    if (code > 0 && !pass_open.load() && torch::autograd::get_current_graph_task_id() != -1) {
      record(PASS_START);
      open_pass();
    }
    forward_marks.push_back(now_ns());
    forward_marks.push_back(code);
    forward_marks.push_back(static_cast<int64_t>(PyThread_get_thread_ident()));
  } catch (const std::exception& exc) {
    PyErr_SetString(PyExc_RuntimeError, exc.what());
    return false;
  }
  return true;
}

// flight_mark(code): a call of module `code` opens (+code) or closes (-code) on this thread. A call
// that opens inside a backward pass none of our hooks has seen yet (reentrant checkpointing
// re-running a whole model first) opens the pass, so it counts as recomputation.
PyObject* flight_mark(PyObject* /*self*/, PyObject* arg) {
  const long long code = PyLong_AsLongLong(arg);
  if (code == -1 && PyErr_Occurred()) {
    return nullptr;
  }
  if (current_serial.load(std::memory_order_relaxed) < 0) {
    Py_RETURN_NONE;
  }
  if (!add_mark(code)) {  // no C++ exception may unwind through the interpreter's frames
    return nullptr;
  }
  Py_RETURN_NONE;
}

// flight_after(args, output): a call has returned (its closing mark is the last one): hook the
// autograd node of its output, which runs when the call's backward starts. Nothing when autograd is
// off, the output has no tracked tensor, or its node is one of the arguments' (it made none).
PyObject* flight_after(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2 || !PyTuple_Check(args[0])) {
    PyErr_SetString(PyExc_TypeError, "flight_after(args: tuple, output)");
    return nullptr;
  }
  const int64_t serial = current_serial.load(std::memory_order_relaxed);
  if (serial < 0 || !at::GradMode::is_enabled() || forward_marks.empty()) {
    Py_RETURN_NONE;
  }
  // No C++ exception may unwind through the interpreter's frames: THPVariable_Check throws
  // python_error where an isinstance check raises (an output whose __class__ raises), as the
  // Python path's isinstance would.
  PyObject* tensor = nullptr;
  try {
    tensor = output_tensor(args[1]);
    if (tensor != nullptr) {
      hook_node(tensor, args[0], serial, static_cast<int64_t>(forward_marks.size() / 3) - 1);
    }
  } catch (python_error& exc) {
    Py_XDECREF(tensor);
    exc.restore();
    return nullptr;
  } catch (const std::exception& exc) {
    Py_XDECREF(tensor);
    PyErr_SetString(PyExc_RuntimeError, exc.what());
    return nullptr;
  }
  Py_XDECREF(tensor);
  Py_RETURN_NONE;
}

// original(module, *args, **kwargs), without building a tuple of (module, *args) where the
// arguments are few.
PyObject* call_original(PyObject* original, PyObject* module, PyObject* args, PyObject* kwargs) {
  constexpr Py_ssize_t kStack = 8;
  const Py_ssize_t n = PyTuple_GET_SIZE(args);
  PyObject* kw = (kwargs != Py_None && PyDict_GET_SIZE(kwargs) > 0) ? kwargs : nullptr;
  if (n < kStack) {
    PyObject* stack[kStack];
    stack[0] = module;
    for (Py_ssize_t i = 0; i < n; ++i) {
      stack[i + 1] = PyTuple_GET_ITEM(args, i);
    }
    return PyObject_VectorcallDict(original, stack, static_cast<size_t>(n + 1), kw);
  }
  PyObject* all = PyTuple_New(n + 1);
  if (all == nullptr) {
    return nullptr;
  }
  Py_INCREF(module);
  PyTuple_SET_ITEM(all, 0, module);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = PyTuple_GET_ITEM(args, i);
    Py_INCREF(item);
    PyTuple_SET_ITEM(all, i + 1, item);
  }
  PyObject* result = PyObject_Call(original, all, kw);
  Py_DECREF(all);
  return result;
}

// flight_call(codes, original, module, args, kwargs): one recorded call of a class-wrapped module,
// what the Python wrapper otherwise does in three C calls around its own frame's work: the code of
// `module` from `codes` (id(module) -> code; none: a module the recorder does not name, called
// through), the opening mark, original(module, *args, **kwargs), the closing mark (also when it
// raises), and the output's node hook (flight_after). The wrapper keeps torch.compiler's check in
// Python, so that Dynamo, which traces the wrapper, never reaches this call.
PyObject* flight_call(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 5 || !PyDict_Check(args[0]) || !PyTuple_Check(args[3]) ||
      (args[4] != Py_None && !PyDict_Check(args[4]))) {
    PyErr_SetString(PyExc_TypeError, "flight_call(codes: dict, original, module, args: tuple, kwargs: dict)");
    return nullptr;
  }
  PyObject* original = args[1];
  PyObject* module = args[2];
  PyObject* call_args = args[3];
  PyObject* key = PyLong_FromVoidPtr(module);  // id(module)
  if (key == nullptr) {
    return nullptr;
  }
  PyObject* found = PyDict_GetItemWithError(args[0], key);  // borrowed
  Py_DECREF(key);
  if (found == nullptr) {
    if (PyErr_Occurred()) {
      return nullptr;
    }
    return call_original(original, module, call_args, args[4]);
  }
  const long long code = PyLong_AsLongLong(found);
  if (code == -1 && PyErr_Occurred()) {
    return nullptr;
  }
  if (current_serial.load(std::memory_order_relaxed) >= 0 && !add_mark(code)) {
    return nullptr;
  }
  PyObject* output = call_original(original, module, call_args, args[4]);
  // the closing mark, also when the call raised (its exception stays set meanwhile)
  if (current_serial.load(std::memory_order_relaxed) >= 0) {
    PyObject *type = nullptr, *value = nullptr, *traceback = nullptr;
    if (output == nullptr) {
      PyErr_Fetch(&type, &value, &traceback);
    }
    const bool closed = add_mark(-code);
    if (output == nullptr) {
      PyErr_Restore(type, value, traceback);
      return nullptr;
    }
    if (!closed) {
      Py_DECREF(output);
      return nullptr;
    }
  }
  if (output == nullptr) {
    return nullptr;
  }
  PyObject* const after_args[2] = {call_args, output};
  PyObject* hooked = flight_after(nullptr, after_args, 2);  // checks the serial and grad mode itself
  if (hooked == nullptr) {
    Py_DECREF(output);
    return nullptr;
  }
  Py_DECREF(hooked);
  return output;
}

PyMethodDef mark_def = {"flight_mark", flight_mark, METH_O, "A forward mark: +code opens, -code closes."};
PyMethodDef call_def = {
    "flight_call",
    reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(flight_call)),
    METH_FASTCALL,
    "One recorded call of a class-wrapped module (codes, original, module, args, kwargs)."};
PyMethodDef after_def = {
    "flight_after",
    reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(flight_after)),
    METH_FASTCALL,
    "Hook the autograd node of a returned call's output (args, output)."};

// The forward marks since the last take, as int64 bytes ((time ns, code, thread) triples); `keep`:
// leave them in place (a dump of the running step).
py::bytes flight_take_forward(bool keep) {
  py::bytes taken(reinterpret_cast<const char*>(forward_marks.data()), forward_marks.size() * sizeof(int64_t));
  if (!keep) {
    forward_marks.clear();
  }
  return taken;
}

// The recorder's step serial (-1: stopped); hooks of other serials do nothing. A pass whose end
// never came (its backward raised, and the engine dropped the callback) is forgotten here.
void flight_serial(int64_t serial) {
  current_serial.store(serial);
  pass_open.store(false);
}

// Forget every forward mark (a recorder starting or stopping).
void flight_clear_forward() {
  forward_marks.clear();
  forward_marks.shrink_to_fit();
}

// The events since the last take, as int64 bytes ((time ns, call) pairs); the buffer starts empty.
py::bytes flight_take() {
  std::vector<int64_t> taken;
  {
    std::lock_guard<std::mutex> guard(events_lock);
    taken.swap(events);
  }
  return py::bytes(reinterpret_cast<const char*>(taken.data()), taken.size() * sizeof(int64_t));
}

// The clock the events are on, now (for checking it against time.perf_counter_ns).
int64_t flight_now() {
  return now_ns();
}

}  // namespace

void register_functions(py::module_& m) {
  m.def("flight_hook", &flight_hook, py::arg("tensor"), py::arg("args"), py::arg("serial"), py::arg("call"));
  m.def("flight_serial", &flight_serial, py::arg("serial"));
  m.def("flight_take", &flight_take);
  m.def("flight_now", &flight_now);
  m.def("flight_take_forward", &flight_take_forward, py::arg("keep") = false);
  m.def("flight_clear_forward", &flight_clear_forward);
  m.add_object("flight_mark", py::reinterpret_steal<py::object>(PyCFunction_New(&mark_def, nullptr)));
  m.add_object("flight_after", py::reinterpret_steal<py::object>(PyCFunction_New(&after_def, nullptr)));
  m.add_object("flight_call", py::reinterpret_steal<py::object>(PyCFunction_New(&call_def, nullptr)));
  layerscope_shapes::register_functions(m);  // the detailed step's own shapes
}

}  // namespace layerscope_flight
