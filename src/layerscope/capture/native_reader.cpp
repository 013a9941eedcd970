// layerscope's native module: torch's profiler results as columns, in one pass over the C++ events
// (read_columns), and module marks on torch's clock (see "module marks" below).
//
// The bindings path (capture/bindings_reader.py) pays ~1.5-2.5 us per event to make the Python `_KinetoEvent`
// list, ~1 us to free it, and ~0.4 us per accessor call; this reads the same accessors in C++ and
// hands Python a few contiguous int64 buffers, each distinct name and shapes list once.
//
// Built on demand by capture/native.py against the torch installed beside it (never shipped as a
// binary: KinetoEvent's layout and symbols are torch-version specific). Everything returned here is
// plain Python data (bytes, lists, dicts), so a mismatch shows up as an exception, not as bad data.

#include <ATen/record_function.h>
#include <c10/util/ApproximateClock.h>
#include <pybind11/pybind11.h>
#include <structmember.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/csrc/profiler/collection.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <exception>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <version>
#include <variant>
#include <vector>

// libkineto's activity names, from the headers of the torch this is built against (the numbering
// moves between versions, and torch's Python bindings only name it from 2.12 on).
#if __has_include(<kineto/ActivityType.h>)
#include <kineto/ActivityType.h>
#define LAYERSCOPE_KINETO_NAMES 1
#endif

#if defined(__linux__)
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace py = pybind11;
using torch::autograd::profiler::KinetoEvent;
using torch::autograd::profiler::ProfilerResult;
using torch::profiler::impl::EventType;
using torch::profiler::impl::ExtraFields;
using torch::profiler::impl::Result;

// Concrete (scalar) inputs as JSON, the one writer of them: native_shapes.cpp writes its own record's
// inputs with it too, so the two tables cannot drift apart.
namespace layerscope_text {

void append_double(std::string& out, double value) {
  char buffer[32];
  auto written = std::to_chars(buffer, buffer + sizeof(buffer), value);  // shortest round trip
  std::string text(buffer, written.ptr);
  if (text.find_first_of(".e") == std::string::npos) {
    text += ".0";  // stays a float when parsed back
  }
  out += text;
}

// One concrete (scalar) input as JSON; false for a kind this writer does not know. These are the
// kinds torch 2.13 records (strings and devices are recorded as None); anything else is left to
// torch's bindings by the caller.
bool append_ivalue(std::string& out, const c10::IValue& value) {
  if (value.isNone()) {
    out += "null";
  } else if (value.isBool()) {
    out += value.toBool() ? "true" : "false";
  } else if (value.isInt()) {
    out += std::to_string(value.toInt());
  } else if (value.isDouble()) {
    const double number = value.toDouble();
    if (!std::isfinite(number)) return false;
    append_double(out, number);
  } else if (value.isIntList()) {
    out.push_back('[');
    const auto items = value.toIntVector();
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out.push_back(',');
      out += std::to_string(items[i]);
    }
    out.push_back(']');
  } else if (value.isBoolList()) {
    out.push_back('[');
    const auto items = value.toBoolList();
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out.push_back(',');
      out += items.get(i) ? "true" : "false";
    }
    out.push_back(']');
  } else {
    return false;
  }
  return true;
}

}  // namespace layerscope_text

namespace {

// An allocation's address and an out-of-memory event's requested size live only in the event's
// Result, which KinetoEvent keeps private. An explicit template instantiation may name a private
// member (C++ [temp.explicit]): this hands out a pointer to KinetoEvent::result_, read-only.
struct KinetoEventResult {
  using type = std::shared_ptr<const Result> KinetoEvent::*;
  friend type result_member(KinetoEventResult);
};
template <typename Tag, typename Tag::type Member>
struct MemberAccess {
  friend typename Tag::type result_member(Tag) {
    return Member;
  }
};
template struct MemberAccess<KinetoEventResult, &KinetoEvent::result_>;

const Result* result_of_event(const KinetoEvent& e) {
  return (e.*result_member(KinetoEventResult{})).get();
}

// Strings interned in first-seen order: the Python side interns them in the same order as the
// pybind path does (dict.fromkeys over the names), so both paths build identical tables.
// Looked up by a view where the library can (no copy of a name torch holds), else by a copy.
struct Interner {
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view text) const noexcept {
      return std::hash<std::string_view>{}(text);
    }
  };
  std::unordered_map<std::string, int64_t, Hash, std::equal_to<>> ids;
  std::vector<std::string> order;

  int64_t id(std::string_view text) {
#if defined(__cpp_lib_generic_unordered_lookup)
    auto found = ids.find(text);
#else
    auto found = ids.find(std::string(text));
#endif
    if (found != ids.end()) {
      return found->second;
    }
    const auto next = static_cast<int64_t>(order.size());
    order.emplace_back(text);
    ids.emplace(std::string(text), next);
    return next;
  }

  py::list as_bytes() const {
    // bytes, not str: torch has handed back Python-function names that are not valid UTF-8;
    // Python decodes each distinct name and decides what a bad one becomes.
    py::list out(order.size());
    for (size_t i = 0; i < order.size(); ++i) {
      out[i] = py::bytes(order[i]);
    }
    return out;
  }
};

template <typename T>
py::bytes column(const std::vector<T>& values) {
  return py::bytes(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

// The input shapes as orjson.dumps(event.shapes()) writes them: "[[2,3],[]]".
void append_shapes(std::string& out, const c10::ArrayRef<std::vector<int64_t>>& shapes) {
  out.push_back('[');
  for (size_t i = 0; i < shapes.size(); ++i) {
    if (i) out.push_back(',');
    out.push_back('[');
    const auto& dims = shapes[i];
    for (size_t d = 0; d < dims.size(); ++d) {
      if (d) out.push_back(',');
      out += std::to_string(dims[d]);
    }
    out.push_back(']');
  }
  out.push_back(']');
}

// Input shapes interned by their dimensions, not their text: a hash over the int64s finds a list seen
// before, and only a new one is written out (append_shapes) and interned, so ids come in the same
// first-seen order as interning every text would give. (Writing and hashing every event's text cost
// ~0.2 us per event.)
struct ShapesInterner {
  struct Hash {
    size_t operator()(const std::vector<int64_t>& key) const noexcept {
      uint64_t h = 1469598103934665603ull;
      for (const int64_t v : key) {
        h ^= static_cast<uint64_t>(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
      }
      return static_cast<size_t>(h);
    }
  };
  std::unordered_map<std::vector<int64_t>, int64_t, Hash> ids;
  std::vector<int64_t> key;  // the list flattened: per input its rank, then its dims
  std::string text;
  Interner texts;

  int64_t id(const c10::ArrayRef<std::vector<int64_t>>& shapes) {
    size_t size = shapes.size();
    for (const auto& dims : shapes) {
      size += dims.size();
    }
    key.resize(size);  // written in place: growing it an item at a time cost more than the lookup
    int64_t* at = key.data();
    for (const auto& dims : shapes) {
      *at++ = static_cast<int64_t>(dims.size());
      if (!dims.empty()) {
        std::memcpy(at, dims.data(), dims.size() * sizeof(int64_t));
        at += dims.size();
      }
    }
    auto found = ids.find(key);
    if (found != ids.end()) {
      return found->second;
    }
    text.clear();
    append_shapes(text, shapes);
    const int64_t next = texts.id(std::move(text));
    ids.emplace(key, next);
    return next;
  }
};

// Input dtypes lists interned without formatting or hashing each: most ops repeat one of a few
// lists (["float","float"], ["float","Scalar"]), so the lists seen last are compared first, element
// by element; only a list not among them is written out, as orjson.dumps writes
// list(event.dtypes()): ["float",""], and interned. (Formatting every list cost ~0.3 us per event.)
struct DtypesInterner {
  static constexpr size_t kRecent = 16;
  std::vector<std::pair<std::vector<std::string>, int64_t>> recent;  // most recent first
  Interner texts;

  template <typename Dtypes>
  int64_t id(const Dtypes& dtypes) {
    for (size_t k = 0; k < recent.size(); ++k) {
      const auto& seen = recent[k].first;
      if (seen.size() == dtypes.size() && std::equal(seen.begin(), seen.end(), dtypes.begin())) {
        const int64_t found = recent[k].second;
        if (k) std::rotate(recent.begin(), recent.begin() + k, recent.begin() + k + 1);
        return found;
      }
    }
    const int64_t found = texts.id(spell(dtypes));
    if (recent.size() == kRecent) recent.pop_back();
    recent.insert(recent.begin(), {std::vector<std::string>(dtypes.begin(), dtypes.end()), found});
    return found;
  }

  template <typename Dtypes>
  static std::string spell(const Dtypes& dtypes) {
    std::string out("[");
    bool first = true;
    for (const auto& dtype : dtypes) {
      if (!first) out.push_back(',');
      first = false;
      out.push_back('"');
      out += dtype;  // torch's spellings ("float", "c10::BFloat16", "Scalar"): nothing to escape
      out.push_back('"');
    }
    out.push_back(']');
    return out;
  }
};

using layerscope_text::append_ivalue;

// The name of the clock anchors' profiler ranges (module_marks.ANCHOR_NAME).
constexpr const char* kAnchorName = "layerscope::clock";

const ProfilerResult& result_of(const py::object& results) {
  return results.cast<const ProfilerResult&>();
}

// Prefetching: the reader is bound by memory, not work. Each event's data is spread over the heap
// (the KinetoEvent; its Result, whose variant's index sits ~0.5 kB in; the op's name when longer
// than a short string; its shapes list and each input's dims; its dtypes), most of it out of the
// caches after a training step, and one event's work is too long for the processor to overlap the
// next events' misses with it (perf: most of the loop's time was spent waiting on those loads). So
// the loop asks for each event in three stages, each once the pointers the stage reads have
// arrived: the KinetoEvent 3 * kAhead events ahead, its Result and lists 2 * kAhead ahead, what
// those point to (the name, each input's dims) kAhead ahead.
constexpr size_t kAhead = 8;
// The bytes of a KinetoEvent the loop reads: result_, python_stack_, shapes_, dtypes_ (in that order,
// torch's profiler_kineto.h); no further than the whole event.
constexpr size_t kEventHead = std::min<size_t>(sizeof(KinetoEvent), 96);

void prefetch_bytes(const void* at, size_t size) {
  const char* begin = static_cast<const char*>(at);
  for (size_t offset = 0; offset < size; offset += 64) {
    __builtin_prefetch(begin + offset);
  }
  __builtin_prefetch(begin + size - 1);
}

void prefetch_result(const KinetoEvent& e, bool with_shapes) {
  if (const Result* result = result_of_event(e)) {
    prefetch_bytes(result, 192);  // the times, the thread, the op's fields
    // the variant's index, after its storage
    __builtin_prefetch(reinterpret_cast<const char*>(&result->extra_fields_ + 1) - 1);
  }
  if (with_shapes) {
    // every line of the two lists: an op with many inputs spreads them over several
    const auto& listed = e.shapes();
    if (!listed.empty()) prefetch_bytes(listed.data(), listed.size() * sizeof(listed[0]));
    const auto& types = e.dtypes();
    if (!types.empty()) prefetch_bytes(types.data(), types.size() * sizeof(types[0]));
  }
}

void prefetch_pointed(const KinetoEvent& e, bool with_shapes) {
  if (const Result* result = result_of_event(e)) {
    if (const auto* op = std::get_if<ExtraFields<EventType::TorchOp>>(&result->extra_fields_)) {
      __builtin_prefetch(op->name_.data());
    }
  }
  if (with_shapes) {
    for (const auto& dims : e.shapes()) {
      __builtin_prefetch(dims.data());
    }
  }
}

// One event's concrete inputs as a JSON array into `text`; false where an input is of a kind the
// writer above does not know.
bool concrete_text(const KinetoEvent& e, std::string& text) {
  text.assign("[");
  bool known = true;
  if (e.hasConcreteInputs()) {
    const auto inputs = e.concreteInputs();
    for (size_t i = 0; i < inputs.size() && known; ++i) {
      if (i) text.push_back(',');
      known = append_ivalue(text, inputs[i]);
    }
  }
  text.push_back(']');
  return known;
}

// One stretch of torch's events as columns (see read_columns), with its own interners: stretches
// are read on threads of their own and joined in order afterwards (join_columns).
struct Columns {
  std::vector<int64_t> span_index, span_name, span_activity, span_ts, span_dur;
  std::vector<int64_t> span_tid, span_seq, span_fwd_tid, span_corr, span_linked, span_shapes, span_handle;
  std::vector<int64_t> span_dtypes;
  // per span, its concrete inputs' text (an id in `concrete`) where its op has a FLOP formula
  // (`wanted`), kNotWanted elsewhere, kUnknownInputs where an input is of a kind the writer leaves
  // to torch; empty when no op is wanted
  std::vector<int64_t> span_concrete;
  std::vector<int64_t> mem_bytes, mem_ts, mem_tid, mem_device, mem_addr;
  std::vector<int64_t> oom_bytes, oom_ts, oom_tid, oom_device, oom_allocated;
  std::vector<int64_t> anchor_tid, anchor_ts, anchor_dur;
  // device-side spans (few): their row among the spans, device index and stream (resource id)
  std::vector<int64_t> device_row, device_index, device_stream;
  Interner names;
  ShapesInterner shapes;
  DtypesInterner dtypes;
  Interner concrete;
  std::vector<char> wanted_name;  // per name id: whether its op's concrete inputs are read
  int64_t no_dtypes = dtypes.texts.id(std::string("[]"));
  int64_t no_shapes = shapes.texts.id(std::string("[]"));
};

using Column = std::vector<int64_t> Columns::*;

// Every column by its name in read_columns' dict. Joining stretches copies the plain ones as they
// are; the mapped ones hold interned ids (names, shapes, dtypes) or span rows (device_row).
constexpr std::pair<const char*, Column> kPlainColumns[] = {
    {"span_index", &Columns::span_index},       {"span_activity", &Columns::span_activity},
    {"span_ts", &Columns::span_ts},             {"span_dur", &Columns::span_dur},
    {"span_tid", &Columns::span_tid},           {"span_seq", &Columns::span_seq},
    {"span_fwd_tid", &Columns::span_fwd_tid},   {"span_corr", &Columns::span_corr},
    {"span_linked", &Columns::span_linked},     {"span_handle", &Columns::span_handle},
    {"mem_bytes", &Columns::mem_bytes},         {"mem_ts", &Columns::mem_ts},
    {"mem_tid", &Columns::mem_tid},             {"mem_device", &Columns::mem_device},
    {"mem_addr", &Columns::mem_addr},           {"oom_bytes", &Columns::oom_bytes},
    {"oom_ts", &Columns::oom_ts},               {"oom_tid", &Columns::oom_tid},
    {"oom_device", &Columns::oom_device},       {"oom_allocated", &Columns::oom_allocated},
    {"anchor_tid", &Columns::anchor_tid},       {"anchor_ts", &Columns::anchor_ts},
    {"anchor_dur", &Columns::anchor_dur},       {"device_index", &Columns::device_index},
    {"device_stream", &Columns::device_stream},
};
constexpr std::pair<const char*, Column> kMappedColumns[] = {
    {"span_name", &Columns::span_name},
    {"span_shapes", &Columns::span_shapes},
    {"span_dtypes", &Columns::span_dtypes},
    {"span_concrete", &Columns::span_concrete},
    {"device_row", &Columns::device_row},
};

constexpr int64_t kNotWanted = -2;
constexpr int64_t kUnknownInputs = -1;

// Calls `visit(name, column)` for every column of `columns`.
template <typename Visit>
void each_column(Columns& columns, Visit visit) {
  for (const auto& [name, member] : kPlainColumns) visit(std::string_view(name), columns.*member);
  for (const auto& [name, member] : kMappedColumns) visit(std::string_view(name), columns.*member);
}

// Events [begin, end) into `out`. Memory events (the only ones with a byte count) go to mem_*; the
// rest are spans, in the order torch lists them, as the pybind reader keeps them. Reads torch's C++
// events only (const accessors, no Python): safe on any thread, several at once.
void read_stretch(const std::vector<KinetoEvent>& events, size_t begin, size_t end, bool with_shapes,
                  const std::unordered_set<std::string>& wanted, Columns& out) {
  // Room for every event as a span: no column is copied while it grows.
  each_column(out, [&](std::string_view name, std::vector<int64_t>& column) {
    if (name.starts_with("span_") && (name != "span_concrete" || !wanted.empty())) column.reserve(end - begin);
  });
  int64_t anchor_name = -1;  // the anchors' name id, once seen
  std::string text;           // one event's concrete inputs, written here before interning
  for (size_t i = begin; i < end; ++i) {
    // only the KinetoEvent's first fields (the Result, the shapes and dtypes lists); each
    // prefetch holds a line fill buffer while it waits, and those are what the loop runs short of
    if (i + 3 * kAhead < end) prefetch_bytes(&events[i + 3 * kAhead], kEventHead);
    if (i + 2 * kAhead < end) prefetch_result(events[i + 2 * kAhead], with_shapes);
    if (i + kAhead < end) prefetch_pointed(events[i + kAhead], with_shapes);
    const KinetoEvent& e = events[i];
    const int64_t nbytes = e.nBytes();
    if (nbytes != 0) {
      out.mem_bytes.push_back(nbytes);
      out.mem_ts.push_back(static_cast<int64_t>(e.startNs()));
      // torch's "unknown thread" is 2**64 - 1: as int64 it reads -1, as the pybind path reads it.
      out.mem_tid.push_back(static_cast<int64_t>(e.startThreadId()));
      out.mem_device.push_back(static_cast<int64_t>(e.deviceType()));
      const Result* result = result_of_event(e);
      const auto* allocation =
          result ? std::get_if<ExtraFields<EventType::Allocation>>(&result->extra_fields_) : nullptr;
      out.mem_addr.push_back(
          allocation ? static_cast<int64_t>(reinterpret_cast<intptr_t>(allocation->ptr_)) : 0);
      continue;
    }
    const Result* result = result_of_event(e);
    if (result != nullptr) {
      if (const auto* oom = std::get_if<ExtraFields<EventType::OutOfMemory>>(&result->extra_fields_)) {
        out.oom_bytes.push_back(oom->alloc_size_);
        out.oom_ts.push_back(static_cast<int64_t>(e.startNs()));
        out.oom_tid.push_back(static_cast<int64_t>(e.startThreadId()));
        out.oom_device.push_back(static_cast<int64_t>(oom->device_type_));
        out.oom_allocated.push_back(static_cast<int64_t>(oom->total_allocated_));
        continue;
      }
    }
    // An op's name read where torch keeps it (what KinetoEvent::name() copies out); others copied.
    const auto* op = result ? std::get_if<ExtraFields<EventType::TorchOp>>(&result->extra_fields_) : nullptr;
    auto& names = out.names;
    const size_t known_names = names.order.size();
    const int64_t name = op ? names.id(op->name_) : names.id(e.name());
    if (names.order.size() != known_names) {
      if (names.order.back() == kAnchorName) {
        anchor_name = name;  // interned where first seen all the same: the name ids stay as they were
      }
      out.wanted_name.push_back(static_cast<char>(wanted.count(names.order.back())));
    }
    if (name == anchor_name) {
      // A clock anchor's range: its stamps are all the marks need of it (module_marks.add_to), and
      // leaving it out here spares copying every column to drop it afterwards.
      out.anchor_tid.push_back(static_cast<int64_t>(e.startThreadId()));
      out.anchor_ts.push_back(static_cast<int64_t>(e.startNs()));
      out.anchor_dur.push_back(static_cast<int64_t>(e.durationNs()));
      continue;
    }
    // Device work carries its launching thread's id; its stream is what a trace file names it by.
    // Ops run on the CPU, so only the other spans (few on a CPU capture) are asked.
    if (op == nullptr && e.deviceType() != c10::DeviceType::CPU) {
      out.device_row.push_back(static_cast<int64_t>(out.span_index.size()));
      out.device_index.push_back(static_cast<int64_t>(e.deviceIndex()));
      out.device_stream.push_back(e.deviceResourceId());
    }
    out.span_index.push_back(static_cast<int64_t>(i));
    out.span_name.push_back(name);
    out.span_activity.push_back(static_cast<int64_t>(e.activityType()));
    out.span_ts.push_back(static_cast<int64_t>(e.startNs()));
    out.span_dur.push_back(static_cast<int64_t>(e.durationNs()));
    out.span_tid.push_back(static_cast<int64_t>(e.startThreadId()));
    const int64_t seq = e.sequenceNr();
    out.span_seq.push_back(seq);
    out.span_fwd_tid.push_back(seq >= 0 ? static_cast<int64_t>(e.fwdThreadId()) : 0);
    out.span_corr.push_back(static_cast<int64_t>(e.correlationId()));
    out.span_linked.push_back(static_cast<int64_t>(e.linkedCorrelationId()));
    // The RecordFunction handle of an op: what call lines (native_lines.cpp) are recorded against.
    out.span_handle.push_back(op ? static_cast<int64_t>(op->record_function_id_) : 0);
    const bool shaped = with_shapes && e.hasShapes();
    out.span_shapes.push_back(shaped ? out.shapes.id(e.shapes()) : out.no_shapes);
    // Every input's dtype beside its shape: what bytes per op are computed from (roofline).
    out.span_dtypes.push_back(shaped && e.hasTypes() ? out.dtypes.id(e.dtypes()) : out.no_dtypes);
    // A FLOP formula's scalar inputs read here, while the event is in cache: a pass of their own
    // over the few ops that have formulas waits on memory for each one again.
    if (!wanted.empty()) {
      int64_t inputs = kNotWanted;
      if (out.wanted_name[static_cast<size_t>(name)]) {
        inputs = concrete_text(e, text) ? out.concrete.id(text) : kUnknownInputs;
      }
      out.span_concrete.push_back(inputs);
    }
  }
}

// `texts` ids of `from` in `into`'s id space: a later stretch's texts interned after the earlier
// stretches', in its own first-seen order, which is the order one pass over all would give.
std::vector<int64_t> merged_ids(Interner& into, const Interner& from) {
  std::vector<int64_t> ids(from.order.size());
  for (size_t k = 0; k < ids.size(); ++k) {
    ids[k] = into.id(from.order[k]);
  }
  return ids;
}

void append_mapped(std::vector<int64_t>& into, const std::vector<int64_t>& from, const std::vector<int64_t>& ids) {
  for (const int64_t local : from) {
    into.push_back(local < 0 ? local : ids[static_cast<size_t>(local)]);  // markers (< 0) as they are
  }
}

// Room in `into` for every stretch's rows: each join then appends without regrowing.
void reserve_for(Columns& into, std::vector<Columns>& stretches) {
  std::unordered_map<std::string_view, size_t> rows;
  for (auto& stretch : stretches) {
    each_column(stretch, [&](std::string_view name, std::vector<int64_t>& column) { rows[name] += column.size(); });
  }
  each_column(into, [&](std::string_view name, std::vector<int64_t>& column) { column.reserve(rows[name]); });
}

// The later stretch `from` appended to `into`: its interned ids mapped into `into`'s, its span rows
// moved past `into`'s spans.
void join_columns(Columns& into, const Columns& from) {
  const auto name_ids = merged_ids(into.names, from.names);
  const auto shape_ids = merged_ids(into.shapes.texts, from.shapes.texts);
  const auto dtype_ids = merged_ids(into.dtypes.texts, from.dtypes.texts);
  const auto concrete_ids = merged_ids(into.concrete, from.concrete);
  const auto rows = static_cast<int64_t>(into.span_index.size());
  for (const int64_t row : from.device_row) {
    into.device_row.push_back(row + rows);
  }
  append_mapped(into.span_name, from.span_name, name_ids);
  append_mapped(into.span_shapes, from.span_shapes, shape_ids);
  append_mapped(into.span_dtypes, from.span_dtypes, dtype_ids);
  append_mapped(into.span_concrete, from.span_concrete, concrete_ids);
  for (const auto& [name, member] : kPlainColumns) {
    (into.*member).insert((into.*member).end(), (from.*member).begin(), (from.*member).end());
  }
}

// Events per thread below which another thread does not pay for itself (its start, its stretch's
// join) and above which a stretch still fills the prefetcher's pipeline.
constexpr size_t kEventsPerThread = 16384;
constexpr size_t kMaxThreads = 8;

// How many threads read `n` events: `asked` when given (1: this thread only; never more than the
// events), else as many as the machine has and the events fill, at most kMaxThreads.
size_t reader_threads(size_t n, int64_t asked) {
  if (asked > 0) return std::max<size_t>(1, std::min(static_cast<size_t>(asked), n));
  size_t cores = std::max<unsigned>(1, std::thread::hardware_concurrency());
#if defined(__linux__)
  // the cores this process may run on (a job pinned to a few, one rank's share of a node)
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0) {
    cores = std::max<size_t>(1, static_cast<size_t>(CPU_COUNT(&allowed)));
  }
#endif
  return std::max<size_t>(1, std::min({cores, n / kEventsPerThread, kMaxThreads}));
}

// Every event as columns (read_stretch). The loop waits on memory more than it computes (see
// "Prefetching"): stretches of the list read on threads of their own overlap those waits, and the
// stretches joined in order give the very columns one pass gives. `threads`: 0 as many as pay off,
// 1 this thread alone (the flight recorder's writer reads beside the program's threads). `wanted`:
// the op names whose concrete inputs are read too (span_concrete, "concrete": the FLOP formulas').
py::dict read_columns(const py::object& results, bool with_shapes, int64_t threads, const py::iterable& wanted_names) {
  const auto& events = result_of(results).events();
  std::unordered_set<std::string> wanted;  // the ops whose concrete inputs are read (span_concrete)
  for (const auto& name : wanted_names) wanted.insert(name.cast<std::string>());
  const size_t n = events.size();
  const size_t parts = reader_threads(n, threads);
  std::vector<Columns> stretches(parts);
  {
    // The pass reads torch's C++ events into C++ containers only: other Python threads run
    // meanwhile (the flight recorder reads its detailed steps on a writer thread beside the loop).
    py::gil_scoped_release release;
    std::vector<std::exception_ptr> failures(parts);
    auto read = [&](size_t k) {
      try {
        read_stretch(events, n * k / parts, n * (k + 1) / parts, with_shapes, wanted, stretches[k]);
      } catch (...) {
        failures[k] = std::current_exception();
      }
    };
    std::vector<std::thread> helpers;
    helpers.reserve(parts);
    size_t started = 1;  // stretches 1 .. started-1 have a thread of their own
    try {
      for (; started < parts; ++started) {
        helpers.emplace_back(read, started);
      }
    } catch (const std::system_error&) {
      // no more threads to be had (a process or container limit): the rest are read here
    }
    for (size_t k = started; k < parts; ++k) read(k);
    read(0);
    for (auto& helper : helpers) {
      helper.join();
    }
    for (const auto& failure : failures) {
      if (failure) std::rethrow_exception(failure);
    }
    reserve_for(stretches[0], stretches);
    for (size_t k = 1; k < parts; ++k) {
      join_columns(stretches[0], stretches[k]);
    }
  }
  Columns& c = stretches[0];
  py::dict out;
  out["names"] = c.names.as_bytes();
  out["shapes"] = c.shapes.texts.as_bytes();
  out["dtypes"] = c.dtypes.texts.as_bytes();
  out["concrete"] = c.concrete.as_bytes();
  each_column(c, [&](std::string_view name, std::vector<int64_t>& values) {
    out[py::str(name.data(), name.size())] = column(values);
  });
  return out;
}

// Event positions packed as int64 bytes by the caller.
std::vector<int64_t> unpack_indices(const py::bytes& packed_indices) {
  const std::string packed = packed_indices;
  std::vector<int64_t> indices(packed.size() / sizeof(int64_t));
  std::memcpy(indices.data(), packed.data(), indices.size() * sizeof(int64_t));
  return indices;
}

const KinetoEvent& event_of(const std::vector<KinetoEvent>& events, int64_t index) {
  if (index < 0 || static_cast<size_t>(index) >= events.size()) {
    throw py::index_error("event index out of range");
  }
  return events[static_cast<size_t>(index)];
}

// The concrete inputs of the events at `packed_indices` (positions in torch's event list, packed
// int64) as JSON arrays, or None where an input is of a kind the writer above does not know (the
// caller then asks torch's bindings).
py::list concrete_inputs(const py::object& results, const py::bytes& packed_indices) {
  const auto& events = result_of(results).events();
  const std::vector<int64_t> indices = unpack_indices(packed_indices);
  py::list out(indices.size());
  std::string text;
  for (size_t k = 0; k < indices.size(); ++k) {
    const bool known = concrete_text(event_of(events, indices[k]), text);
    out[k] = known ? py::object(py::bytes(text)) : py::object(py::none());
  }
  return out;
}

// The dtype of the first typed input of the events at `packed_indices` ("" when none): what FLOPs
// are counted in, for MFU against the peak of that dtype.
py::list first_dtypes(const py::object& results, const py::bytes& packed_indices) {
  const auto& events = result_of(results).events();
  const std::vector<int64_t> indices = unpack_indices(packed_indices);
  py::list out(indices.size());
  for (size_t k = 0; k < indices.size(); ++k) {
    const auto index = indices[k];
    if (index < 0 || static_cast<size_t>(index) >= events.size()) {
      throw py::index_error("event index out of range");
    }
    const KinetoEvent& e = events[static_cast<size_t>(index)];
    std::string found;
    if (e.hasTypes()) {
      for (const auto& dtype : e.dtypes()) {
        if (!dtype.empty()) {
          found = dtype;
          break;
        }
      }
    }
    out[k] = py::str(found);
  }
  return out;
}

// torch's own Python object for one event (a copy), for what only torch's bindings can convert.
py::object event_at(const py::object& results, int64_t index) {
  const auto& events = result_of(results).events();
  if (index < 0 || static_cast<size_t>(index) >= events.size()) {
    throw py::index_error("event index out of range");
  }
  return py::cast(events[static_cast<size_t>(index)]);
}

// ----- module marks ------------------------------------------------------------------------------
// Module boundaries as timestamps instead of profiler ranges: a mark is torch's own raw clock read
// (c10::getApproximateTime, what torch stamps its CPU events with) plus a code, appended to a
// per-thread buffer (~0.05 us from Python, against ~0.85-2.5 us for a profiler range). At the end the
// marks are converted to Unix ns by our own ApproximateClockToUnixTimeConverter, made the way torch
// makes its own; benchmarks/clock_marks.py measured the two to agree within tens of ns, while marks
// taken in Python sit 0.5-1 us from the nearest op boundary.

struct MarkBuffer {
  uint64_t session;
  int64_t torch_tid;  // at::RecordFunction::currentThreadId(): the thread id torch's events carry
  int64_t os_tid;     // the thread id torch writes into Chrome traces
  std::vector<c10::approx_time_t> times;
  std::vector<int64_t> codes;
  // Uncontended but for the end of a session: the GIL already serialises callers; this keeps a
  // free-threaded Python (or a caller that dropped the GIL) from reading a buffer being grown.
  std::mutex lock;
};

std::mutex marks_mutex;
std::vector<std::shared_ptr<MarkBuffer>> mark_buffers;
std::unique_ptr<c10::ApproximateClockToUnixTimeConverter> mark_clock;
std::atomic<uint64_t> mark_session{0};
thread_local std::shared_ptr<MarkBuffer> thread_marks;

int64_t os_thread_id() {
#if defined(__linux__)
  return static_cast<int64_t>(syscall(SYS_gettid));
#else
  return 0;
#endif
}

MarkBuffer& marks_of_this_thread() {
  const uint64_t session = mark_session.load(std::memory_order_acquire);
  MarkBuffer* found = thread_marks.get();
  if (found == nullptr || found->session != session) {
    auto fresh = std::make_shared<MarkBuffer>();
    fresh->session = session;
    fresh->torch_tid = static_cast<int64_t>(at::RecordFunction::currentThreadId());
    fresh->os_tid = os_thread_id();
    std::lock_guard<std::mutex> guard(marks_mutex);
    mark_buffers.push_back(fresh);
    thread_marks = std::move(fresh);
  }
  return *thread_marks;
}

// Start a marks session (the clock pairs are measured now, as torch does when profiling starts).
void marks_start() {
  std::lock_guard<std::mutex> guard(marks_mutex);
  mark_buffers.clear();
  mark_clock = std::make_unique<c10::ApproximateClockToUnixTimeConverter>();
  mark_session.fetch_add(1, std::memory_order_acq_rel);
}

// One mark on the calling thread: a positive code opens a scope, its negation closes it.
void mark(int64_t code) {
  MarkBuffer& buffer = marks_of_this_thread();
  const auto now = c10::getApproximateTime();
  std::lock_guard<std::mutex> guard(buffer.lock);
  buffer.times.push_back(now);
  buffer.codes.push_back(code);
}

// Codes of a clock anchor's two raw reads in a thread's marks (no scope code comes near them).
constexpr int64_t kAnchorBefore = std::numeric_limits<int64_t>::min();
constexpr int64_t kAnchorAfter = kAnchorBefore + 1;

// A clock anchor: a profiler range of ours (kAnchorName) between two raw clock reads on this thread.
// torch stamps the range with its own converter, the two reads are converted with ours: where the
// converters disagree by more than the bracket's width (benchmarks/clock_marks.py --sessions saw
// ~2 us in 1 session of 600), the stamps fall outside the bracket and the marks can be shifted
// (module_marks.py). Nothing is recorded when the profiler does not record this thread now.
void clock_anchor() {
  MarkBuffer& buffer = marks_of_this_thread();
  const auto before = c10::getApproximateTime();
  {
    RECORD_USER_SCOPE(kAnchorName);
  }
  const auto after = c10::getApproximateTime();
  std::lock_guard<std::mutex> guard(buffer.lock);
  buffer.times.push_back(before);
  buffer.codes.push_back(kAnchorBefore);
  buffer.times.push_back(after);
  buffer.codes.push_back(kAnchorAfter);
}

// End the session: per thread, (torch thread id, OS thread id, Unix ns times, codes) as int64 bytes.
py::list marks_stop() {
  std::lock_guard<std::mutex> guard(marks_mutex);
  py::list out;
  if (!mark_clock) {
    return out;
  }
  auto to_unix = mark_clock->makeConverter();
  for (const auto& buffer : mark_buffers) {
    std::lock_guard<std::mutex> buffer_guard(buffer->lock);
    std::vector<int64_t> times(buffer->times.size());
    for (size_t i = 0; i < times.size(); ++i) {
      times[i] = static_cast<int64_t>(to_unix(buffer->times[i]));
    }
    out.append(py::make_tuple(buffer->torch_tid, buffer->os_tid, column(times), column(buffer->codes)));
  }
  mark_buffers.clear();
  mark_clock.reset();
  mark_session.fetch_add(1, std::memory_order_acq_rel);  // threads' old buffers are not reused
  return out;
}

// Kineto's name of an activity number (what the trace's "cat" says: "kernel", "cuda_runtime", ...),
// or None when the headers have none for it.
py::object activity_name(int64_t code) {
#ifdef LAYERSCOPE_KINETO_NAMES
  if (code >= 0 && code < static_cast<int64_t>(libkineto::ActivityType::ENUM_COUNT)) {
    return py::str(libkineto::toString(static_cast<libkineto::ActivityType>(code)));
  }
#endif
  return py::none();
}

// ----- rows --------------------------------------------------------------------------------------
// Objects of a slots class (the profile's frozen dataclasses: Metrics, OpStats) made from columns
// without running its __init__. A frozen dataclass's __init__ sets each field through
// object.__setattr__ (~5 us for an op row and its Metrics, 24 fields); here each object is allocated
// by its type, as object.__new__ does, and its slots are filled with the column's items, which is
// what that __init__ leaves behind. The caller (attribution/op_rows.py) names every slot of a class
// without __post_init__; each name must be a writable object slot of the class, each column a list.
py::list slot_objects(const py::handle& cls, const py::sequence& names, const py::sequence& columns) {
  if (!PyType_Check(cls.ptr())) {
    throw py::type_error("slot_objects: not a class");
  }
  auto* type = reinterpret_cast<PyTypeObject*>(cls.ptr());
  const size_t width = py::len(names);
  if (py::len(columns) != width) {
    throw py::value_error("slot_objects: one column per slot");
  }
  std::vector<Py_ssize_t> offsets;
  std::vector<PyObject*> lists;  // borrowed: `columns` holds them
  Py_ssize_t rows = 0;
  for (size_t j = 0; j < width; ++j) {
    const py::object name = names[j];
    PyObject* descr = _PyType_Lookup(type, name.ptr());  // borrowed
    if (descr == nullptr || Py_TYPE(descr) != &PyMemberDescr_Type) {
      throw py::type_error("slot_objects: not a slot of the class: " + py::str(name).cast<std::string>());
    }
    const PyMemberDef* member = reinterpret_cast<PyMemberDescrObject*>(descr)->d_member;
    if (member->type != T_OBJECT_EX || (member->flags & READONLY) != 0 ||
        member->offset + static_cast<Py_ssize_t>(sizeof(PyObject*)) > type->tp_basicsize) {
      throw py::type_error("slot_objects: not a writable object slot: " + py::str(name).cast<std::string>());
    }
    const py::object column = columns[j];
    if (!PyList_Check(column.ptr())) {
      throw py::type_error("slot_objects: a column is not a list");
    }
    const Py_ssize_t size = PyList_GET_SIZE(column.ptr());
    if (j == 0) {
      rows = size;
    } else if (size != rows) {
      throw py::value_error("slot_objects: columns of different lengths");
    }
    offsets.push_back(member->offset);
    lists.push_back(column.ptr());
  }
  py::list out(rows);
  for (Py_ssize_t i = 0; i < rows; ++i) {
    PyObject* object = type->tp_alloc(type, 0);  // slots start NULL, as after object.__new__
    if (object == nullptr) {
      throw py::error_already_set();
    }
    char* base = reinterpret_cast<char*>(object);
    for (size_t j = 0; j < width; ++j) {
      PyObject* value = PyList_GET_ITEM(lists[j], i);
      Py_INCREF(value);
      *reinterpret_cast<PyObject**>(base + offsets[j]) = value;
    }
    PyList_SET_ITEM(out.ptr(), i, object);  // steals the reference
  }
  return out;
}

}  // namespace

namespace layerscope_lines {
void register_functions(py::module_& m);  // native_lines.cpp
}

namespace layerscope_flight {
void register_functions(py::module_& m);  // native_flight.cpp
}

namespace layerscope_objects {
void register_functions(py::module_& m);  // native_objects.cpp
}

// Free torch's events (its KinetoEvents and its event tree: ~2 us an event to destroy) with the GIL
// released, for the sole owner of the results, done with them (Recording.keep_events_only with
// sole_owner: the flight recorder's writer, which reads a detailed step and then discards it on the
// same thread); no other thread may read these results meanwhile (read_columns and the others read
// them by reference, without the GIL). The results stay a valid, empty object, freed later with what
// is left (the Kineto trace). Without the GIL is safe: the Results keep module and optimizer objects
// as plain pointers, and an IValue payload that owns a Python object (a Python object holder, a
// SymNode) takes the GIL itself in its destructor.
void discard_events(const py::object& results) {
  auto& result = const_cast<ProfilerResult&>(result_of(results));
  auto events = std::move(const_cast<std::vector<KinetoEvent>&>(result.events()));
  auto tree = std::move(const_cast<std::vector<std::shared_ptr<Result>>&>(result.event_tree()));
  py::gil_scoped_release release;
  events.clear();
  events.shrink_to_fit();
  tree.clear();
  tree.shrink_to_fit();
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "layerscope native reader: torch profiler results as columns";
  m.def("read_columns", &read_columns, py::arg("results"), py::arg("with_shapes"), py::arg("threads") = 0,
        py::arg("wanted") = py::tuple());
  m.def("discard_events", &discard_events, py::arg("results"));
  m.def("concrete_inputs", &concrete_inputs, py::arg("results"), py::arg("packed_indices"));
  m.def("first_dtypes", &first_dtypes, py::arg("results"), py::arg("packed_indices"));
  m.def("event_at", &event_at, py::arg("results"), py::arg("index"));
  m.def("activity_name", &activity_name, py::arg("code"));
  m.def("slot_objects", &slot_objects, py::arg("cls"), py::arg("names"), py::arg("columns"));
  m.def("marks_start", &marks_start);
  m.def("mark", &mark, py::arg("code"));
  m.def("marks_stop", &marks_stop);
  m.def("clock_anchor", &clock_anchor);
  m.attr("ANCHOR_BEFORE") = kAnchorBefore;
  m.attr("ANCHOR_AFTER") = kAnchorAfter;
  m.attr("ANCHOR_NAME") = kAnchorName;
  layerscope_lines::register_functions(m);
  layerscope_flight::register_functions(m);
  layerscope_objects::register_functions(m);
}
