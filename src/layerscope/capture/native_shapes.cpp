// Input shapes recorded by layerscope itself, for a profile run with torch's record_shapes off (part of
// layerscope's native module; see capture/flight_shapes.py).
//
// torch's record_shapes keeps every op's inputs, then at the profiler's stop formats each op's shapes,
// strides, dtypes and scalar arguments into strings for the Kineto trace (AddGenericMetadata in
// profiler_kineto.cpp), whether or not a trace is written, and frees them later: ~95 ms of the stop and
// ~45 ms of the free for a 26,000-op training step. No option skips that. Here a RecordFunction
// callback records what the reader takes from torch's events (each input's kind, dtype and sizes;
// scalar and short scalar-list inputs as values) as int64 words per thread, against the op's
// RecordFunction handle, which torch's profiler keeps on the same event (TorchOpBasicFields::
// record_function_id_): the reader joins the two by that handle, exactly (handles are unique in the
// process). Inputs are classified as torch's InputOutputEncoder::push classifies them, and written
// back out as native_reader.cpp writes torch's (append_shapes, DtypesInterner, append_ivalue); the
// tables are compared whole with those of a record_shapes=True capture (tests/test_flight_shapes.py).
//
// The callback is global (every thread, a superset of what torch records: records torch has no event
// for are never joined) and runs at the start of every op with inputs while a recording is on.

// As torch is built: without NDEBUG, RecordFunction::inputs() asserts a member (inputs_valid_) that
// torch's own build of the class does not have, reading padding instead (ops started without inputs
// then fail the assertion in this callback). The member sits in padding either way, so the layout is
// torch's in every file of the module; inputs() is called (and inlined) in this file only.
#ifndef NDEBUG
#define NDEBUG
#endif

#include <ATen/record_function.h>
#include <c10/core/ScalarTypeToTypeMeta.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/profiler/collection.h>

#include <atomic>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace layerscope_text {
bool append_ivalue(std::string& out, const c10::IValue& value);  // native_reader.cpp
}  // namespace layerscope_text

namespace layerscope_shapes {
namespace {

// An input's kind, as torch's InputOutputEncoder tags it. A tensor is followed by its dtype, its rank
// and its sizes; a scalar or scalar list has its value in the thread's value list.
enum Kind : int64_t {
  TENSOR = 0,
  NO_TENSOR = 1,    // undefined, nested or with symbolic sizes: torch records no metadata
  TENSOR_LIST = 2,  // every element recorded: dtype "TensorList"
  BAD_LIST = 3,     // a tensor list with an element torch records no metadata for: no dtype
  SCALAR = 4,
  SCALAR_LIST = 5,
  OTHER = 6,
};

// One thread's records: per op with inputs, its handle, its input count, then per input its kind
// (and a tensor's dtype, rank, sizes); scalar values in order beside.
struct ThreadRecords {
  std::vector<int64_t> words;
  std::vector<c10::IValue> values;
  std::mutex lock;  // taken by the owner per op (uncontended) and by shapes_take
};

struct ThreadState {
  uint64_t session = 0;
  std::shared_ptr<ThreadRecords> records;
};

std::mutex state_mutex;  // guards session_records and callback
std::vector<std::shared_ptr<ThreadRecords>> session_records;
std::atomic<uint64_t> session{0};
at::CallbackHandle callback = 0;
thread_local ThreadState thread_state;

ThreadRecords& records_of_this_thread() {
  ThreadState& state = thread_state;
  const uint64_t now = session.load(std::memory_order_acquire);
  if (state.session != now || !state.records) {
    state.session = now;
    state.records = std::make_shared<ThreadRecords>();
    std::lock_guard<std::mutex> guard(state_mutex);
    session_records.push_back(state.records);
  }
  return *state.records;
}

// What torch records metadata for (InputOutputEncoder::push(const at::Tensor&)).
bool recordable(const at::Tensor& t) {
  return t.defined() && !t.is_nested() && !t.unsafeGetTensorImpl()->has_symbolic_sizes_strides();
}

// InputOutputEncoder::isSupportedScalarList.
bool scalar_list(const c10::IValue& value) {
  if (!torch::profiler::impl::get_record_concrete_inputs_enabled() || !value.isList()) {
    return false;
  }
  const auto items = value.toListRef();
  if (items.empty()) {
    return true;
  }
  return items[0].isScalar() && items.size() <= static_cast<size_t>(torch::profiler::impl::SCALAR_LIST_LENGTH_LIMIT);
}

void push_input(ThreadRecords& r, const c10::IValue& value) {
  if (value.isTensor()) {
    const at::Tensor& t = value.toTensor();
    if (!recordable(t)) {
      r.words.push_back(NO_TENSOR);
      return;
    }
    const auto sizes = t.sizes();
    r.words.push_back(TENSOR);
    r.words.push_back(static_cast<int64_t>(t.scalar_type()));
    r.words.push_back(static_cast<int64_t>(sizes.size()));
    r.words.insert(r.words.end(), sizes.begin(), sizes.end());
  } else if (value.isScalar()) {
    r.words.push_back(SCALAR);
    r.values.push_back(value);
  } else if (value.isTensorList()) {
    bool all = true;
    for (const auto& item : value.toListRef()) {
      all = all && item.isTensor() && recordable(item.toTensor());
    }
    r.words.push_back(all ? TENSOR_LIST : BAD_LIST);
  } else if (scalar_list(value)) {
    r.words.push_back(SCALAR_LIST);
    r.values.push_back(value);
  } else {
    r.words.push_back(OTHER);
  }
}

std::unique_ptr<at::ObserverContext> on_op_start(const at::RecordFunction& fn) {
  const auto inputs = fn.inputs();
  if (inputs.empty()) {
    return nullptr;  // torch's event has no shapes either
  }
  ThreadRecords& r = records_of_this_thread();
  std::lock_guard<std::mutex> guard(r.lock);
  r.words.push_back(static_cast<int64_t>(fn.handle()));
  r.words.push_back(static_cast<int64_t>(inputs.size()));
  for (const auto& value : inputs) {
    push_input(r, value);
  }
  return nullptr;
}

// ----- reading ---------------------------------------------------------------------------------------

// The records of one recording, taken from every thread: joined to torch's events by handle.
struct ShapeRecord {
  std::vector<std::vector<int64_t>> words;  // per thread
  std::vector<std::vector<c10::IValue>> values;
  // handle -> (thread, word offset of the input count, offset of the first value)
  std::unordered_map<int64_t, std::tuple<uint32_t, size_t, size_t>> where;
  bool indexed = false;
  int64_t ops = 0;

  void index() {
    if (indexed) return;
    indexed = true;
    for (uint32_t k = 0; k < words.size(); ++k) {
      const auto& w = words[k];
      size_t at = 0, value = 0;
      while (at < w.size()) {
        const int64_t handle = w[at];
        const size_t count_at = at + 1;
        where[handle] = {k, count_at, value};
        ++ops;
        at = count_at + 1;
        for (int64_t i = 0; i < w[count_at]; ++i) {
          const int64_t kind = w[at++];
          if (kind == TENSOR) {
            at += 2 + static_cast<size_t>(w[at + 1]);
          } else if (kind == SCALAR || kind == SCALAR_LIST) {
            ++value;
          }
        }
      }
    }
  }

  // Calls visit(kind, dtype, rank, sizes pointer, value pointer) per input of the op `handle`; false
  // when no op of that handle was recorded (an op without inputs, or an event that is no op).
  template <typename Visit>
  bool inputs(int64_t handle, Visit&& visit) const {
    const auto found = where.find(handle);
    if (found == where.end()) return false;
    const auto& [thread, count_at, first_value] = found->second;
    const auto& w = words[thread];
    const c10::IValue* value = values[thread].data() + first_value;
    size_t at = count_at + 1;
    for (int64_t i = 0; i < w[count_at]; ++i) {
      const int64_t kind = w[at++];
      if (kind == TENSOR) {
        const int64_t rank = w[at + 1];
        visit(kind, w[at], rank, w.data() + at + 2, nullptr);
        at += 2 + static_cast<size_t>(rank);
      } else if (kind == SCALAR || kind == SCALAR_LIST) {
        visit(kind, int64_t{0}, int64_t{0}, nullptr, value++);
      } else {
        visit(kind, int64_t{0}, int64_t{0}, nullptr, nullptr);
      }
    }
    return true;
  }
};

// The dtype torch writes for an input (KinetoEvent::dtypes): a tensor's type name, "TensorList",
// "Scalar", "ScalarList", else "".
std::string dtype_name(int64_t kind, int64_t dtype) {
  switch (kind) {
    case TENSOR:
      return std::string(c10::scalarTypeToTypeMeta(static_cast<c10::ScalarType>(dtype)).name());
    case TENSOR_LIST:
      return "TensorList";
    case SCALAR:
      return "Scalar";
    case SCALAR_LIST:
      return "ScalarList";
    default:
      return "";
  }
}

// Texts interned in first-seen order, "[]" first (as native_reader.cpp's read_columns does).
struct Texts {
  std::unordered_map<std::string, int64_t> ids;
  std::vector<std::string> order;
  Texts() { id("[]"); }
  int64_t id(const std::string& text) {
    const auto found = ids.find(text);
    if (found != ids.end()) return found->second;
    const auto next = static_cast<int64_t>(order.size());
    order.push_back(text);
    ids.emplace(text, next);
    return next;
  }
  py::list as_bytes() const {
    py::list out(order.size());
    for (size_t i = 0; i < order.size(); ++i) out[i] = py::bytes(order[i]);
    return out;
  }
};

std::vector<int64_t> unpack(const py::bytes& packed) {
  const std::string raw = packed;
  std::vector<int64_t> out(raw.size() / sizeof(int64_t));
  std::memcpy(out.data(), raw.data(), out.size() * sizeof(int64_t));
  return out;
}

template <typename T>
py::bytes column(const std::vector<T>& values) {
  return py::bytes(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

// Per span (its RecordFunction handle, packed int64; 0 for no op) the ids of its shapes and dtypes
// texts, written as native_reader.cpp writes torch's: "[[2,3],[]]" and ["float","Scalar"].
py::dict join_columns(ShapeRecord& record, const py::bytes& packed_handles) {
  record.index();
  const std::vector<int64_t> handles = unpack(packed_handles);
  Texts shapes, dtypes;
  std::vector<int64_t> span_shapes(handles.size(), 0), span_dtypes(handles.size(), 0);
  std::unordered_map<int64_t, std::pair<int64_t, int64_t>> seen;  // the first op's ids, by shape key
  std::string shape_text, dtype_text;
  for (size_t k = 0; k < handles.size(); ++k) {
    if (handles[k] == 0) continue;
    shape_text.assign("[");
    dtype_text.assign("[");
    bool first = true;
    const bool found = record.inputs(handles[k], [&](int64_t kind, int64_t dtype, int64_t rank, const int64_t* sizes,
                                                     const c10::IValue*) {
      if (!first) {
        shape_text.push_back(',');
        dtype_text.push_back(',');
      }
      first = false;
      shape_text.push_back('[');
      for (int64_t d = 0; d < rank; ++d) {
        if (d) shape_text.push_back(',');
        shape_text += std::to_string(sizes[d]);
      }
      shape_text.push_back(']');
      dtype_text.push_back('"');
      dtype_text += dtype_name(kind, dtype);
      dtype_text.push_back('"');
    });
    if (!found) continue;
    shape_text.push_back(']');
    dtype_text.push_back(']');
    span_shapes[k] = shapes.id(shape_text);
    span_dtypes[k] = dtypes.id(dtype_text);
  }
  py::dict out;
  out["shapes"] = shapes.as_bytes();
  out["span_shapes"] = column(span_shapes);
  out["dtypes"] = dtypes.as_bytes();
  out["span_dtypes"] = column(span_dtypes);
  out["recorded_ops"] = record.ops;
  return out;
}

// A concrete input as JSON, false for a kind left to torch's bindings (here: to torch::jit::toPyObject,
// what those bindings call): native_reader.cpp's writer, the one both tables are written by.
using layerscope_text::append_ivalue;

// The concrete inputs of the ops `packed_handles` as JSON arrays (None input: null), or None where
// one is of a kind append_ivalue does not write (concrete_objects then gives it).
py::list concrete(ShapeRecord& record, const py::bytes& packed_handles) {
  record.index();
  const std::vector<int64_t> handles = unpack(packed_handles);
  py::list out(handles.size());
  std::string text;
  for (size_t k = 0; k < handles.size(); ++k) {
    text.assign("[");
    bool known = true, first = true;
    record.inputs(handles[k], [&](int64_t, int64_t, int64_t, const int64_t*, const c10::IValue* value) {
      if (!first) text.push_back(',');
      first = false;
      if (value == nullptr) {
        text += "null";
      } else if (known) {
        known = append_ivalue(text, *value);
      }
    });
    text.push_back(']');
    out[k] = known ? py::object(py::bytes(text)) : py::object(py::none());
  }
  return out;
}

// One op's concrete inputs as the Python objects torch's _KinetoEvent.concrete_inputs() gives.
py::list concrete_objects(ShapeRecord& record, int64_t handle) {
  record.index();
  py::list out;
  record.inputs(handle, [&](int64_t, int64_t, int64_t, const int64_t*, const c10::IValue* value) {
    out.append(value == nullptr ? py::none() : torch::jit::toPyObject(*value));
  });
  return out;
}

// The dtype of each op's first typed input ("" when none), as native_reader.cpp's first_dtypes.
py::list first_dtypes(ShapeRecord& record, const py::bytes& packed_handles) {
  record.index();
  const std::vector<int64_t> handles = unpack(packed_handles);
  py::list out(handles.size());
  for (size_t k = 0; k < handles.size(); ++k) {
    std::string found;
    record.inputs(handles[k], [&](int64_t kind, int64_t dtype, int64_t, const int64_t*, const c10::IValue*) {
      if (found.empty()) found = dtype_name(kind, dtype);
    });
    out[k] = py::str(found);
  }
  return out;
}

// ----- the callback's lifecycle ------------------------------------------------------------------------

void shapes_start() {
  std::lock_guard<std::mutex> guard(state_mutex);
  if (callback != 0) {
    throw std::runtime_error("input shapes are already being recorded");
  }
  session_records.clear();
  session.fetch_add(1, std::memory_order_acq_rel);
  callback = at::addGlobalCallback(at::RecordFunctionCallback(&on_op_start).needsInputs(true).needsIds(true));
}

// Stop recording (the records stay until taken); safe to call when not recording.
void shapes_stop() {
  std::lock_guard<std::mutex> guard(state_mutex);
  if (callback != 0) {
    at::removeCallback(callback);
    callback = 0;
  }
}

bool shapes_active() {
  std::lock_guard<std::mutex> guard(state_mutex);
  return callback != 0;
}

// The records so far, taken from every thread (moved: no copy of the words on the step's thread).
std::shared_ptr<ShapeRecord> shapes_take() {
  auto record = std::make_shared<ShapeRecord>();
  std::lock_guard<std::mutex> guard(state_mutex);
  for (const auto& r : session_records) {
    std::lock_guard<std::mutex> records_guard(r->lock);
    if (r->words.empty()) continue;
    record->words.push_back(std::move(r->words));
    record->values.push_back(std::move(r->values));
    r->words.clear();
    r->values.clear();
  }
  return record;
}

}  // namespace

void register_functions(py::module_& m) {
  py::class_<ShapeRecord, std::shared_ptr<ShapeRecord>>(m, "ShapeRecord")
      .def("join_columns", &join_columns, py::arg("packed_handles"))
      .def("concrete", &concrete, py::arg("packed_handles"))
      .def("concrete_objects", &concrete_objects, py::arg("handle"))
      .def("first_dtypes", &first_dtypes, py::arg("packed_handles"))
      .def_property_readonly("nbytes", [](const ShapeRecord& r) {
        size_t n = 0;
        for (const auto& w : r.words) n += w.capacity() * sizeof(int64_t);
        for (const auto& v : r.values) n += v.capacity() * sizeof(c10::IValue);
        return n;
      });
  m.def("shapes_start", &shapes_start);
  m.def("shapes_stop", &shapes_stop);
  m.def("shapes_active", &shapes_active);
  m.def("shapes_take", &shapes_take);
}

}  // namespace layerscope_shapes
