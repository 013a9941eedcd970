// The flight recorder's backward starts, in C++ (part of layerscope's native module; see
// capture/flight_scopes.py).
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

#include <pybind11/pybind11.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/python_variable.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace py = pybind11;

namespace layerscope_flight {
namespace {

std::mutex events_lock;
std::vector<int64_t> events;  // (time ns, call) pairs; call -1: a backward pass ended
std::atomic<int64_t> current_serial{-1};  // the recorder's step serial; -1: not recording
std::atomic<bool> pass_open{false};

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

struct BackwardStart : torch::autograd::FunctionPreHook {
  BackwardStart(int64_t serial, int64_t call) : serial_(serial), call_(call) {}

  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    if (current_serial.load(std::memory_order_relaxed) == serial_) {
      record(call_);
      if (!pass_open.exchange(true)) {
        torch::autograd::Engine::get_default_engine().queue_callback([] {
          pass_open.store(false);
          if (current_serial.load(std::memory_order_relaxed) >= 0) {
            record(-1);
          }
        });
      }
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
bool flight_hook(py::handle tensor, py::tuple args, int64_t serial, int64_t call) {
  if (!THPVariable_Check(tensor.ptr())) {
    return false;
  }
  const auto& node = THPVariable_Unpack(tensor.ptr()).grad_fn();
  if (!node) {
    return false;
  }
  for (const auto& arg : args) {
    if (THPVariable_Check(arg.ptr()) && THPVariable_Unpack(arg.ptr()).grad_fn().get() == node.get()) {
      return false;
    }
  }
  node->add_pre_hook(std::make_unique<BackwardStart>(serial, call));
  return true;
}

// The recorder's step serial (-1: stopped); hooks of other serials do nothing. A pass whose end
// never came (its backward raised, and the engine dropped the callback) is forgotten here.
void flight_serial(int64_t serial) {
  current_serial.store(serial);
  pass_open.store(false);
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
}

}  // namespace layerscope_flight
