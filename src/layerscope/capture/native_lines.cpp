// Call lines: which line of the user's code called each op, read from the thread's own Python frames
// when the op starts (part of layerscope's native module; see capture/call_lines.py).
//
// torch's with_stack tracer records every Python call and return of the program and names a frame by
// its function's *definition* line. Here a RecordFunction callback runs at the entry of each
// top-level op (an op not inside another op; backward nodes count as ops, so the work inside them
// is skipped) and walks the calling thread's frame chain: the frames outside torch and layerscope
// become the op's stack of call lines, interned as a tree of (code, line, parent) nodes, and the op's
// RecordFunction handle, which torch's profiler keeps on the same event, is recorded beside the node.
//
// The GIL: torch's Python bindings release it before dispatching, so the callback runs without it.
// Reading this thread's own frames is still safe: only the thread itself pushes or pops its frames,
// and it is inside this call. Nothing here changes a Python object: no reference counts, no frame
// objects made; strings are copied out of the code objects (alive: their frames are executing), and
// a code object's address is trusted again only when its file, name and first line still match.
//
// The frame layout is CPython's internal one (_PyInterpreterFrame), so this is built for 3.11 to
// 3.13 only; elsewhere lines_supported() is false and capture warns that no lines are recorded.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <ATen/SequenceNumber.h>
#include <ATen/record_function.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030E0000
#define Py_BUILD_CORE
#include <internal/pycore_frame.h>
#undef Py_BUILD_CORE
#define LAYERSCOPE_LINES 1
#endif

namespace py = pybind11;

namespace layerscope_lines {
namespace {

#ifdef LAYERSCOPE_LINES

// One thread's records of a session: (RecordFunction handle, stack node) per top-level op.
struct LineRecords {
  int64_t torch_tid = 0;
  std::vector<int64_t> handles;
  std::vector<int64_t> nodes;
  std::mutex lock;  // taken by the owner per record (uncontended) and by lines_stop
};

struct WalkedFrame {
  const _PyInterpreterFrame* frame;
  const PyCodeObject* code;
  int lasti;
  int64_t chain;  // the node of the innermost user frame at or outside this one (-1: none)
};

struct ThreadLines {
  uint64_t session = 0;
  int depth = 0;  // RecordFunctions of the counted scopes open on this thread
  std::shared_ptr<LineRecords> records;
  std::vector<WalkedFrame> last;  // the previous walk, outermost first: its common part is reused
};

struct CodeEntry {
  const PyObject* filename;
  const PyObject* name;
  int firstlineno;
  int64_t id;
  bool internal;
};

struct NodeKey {
  int64_t code, line, parent;
  bool operator==(const NodeKey& o) const { return code == o.code && line == o.line && parent == o.parent; }
};
struct NodeKeyHash {
  size_t operator()(const NodeKey& k) const {
    return std::hash<int64_t>()(k.code * 1000003 ^ k.line * 8191 ^ k.parent);
  }
};

std::mutex state_mutex;  // guards everything below
std::vector<std::string> internal_prefixes;
std::unordered_map<const PyCodeObject*, CodeEntry> codes;
std::vector<std::string> code_files, code_functions;
std::unordered_map<NodeKey, int64_t, NodeKeyHash> nodes;
std::vector<int64_t> node_code, node_line, node_parent;
std::vector<std::shared_ptr<LineRecords>> session_records;
std::atomic<uint64_t> session{0};
at::CallbackHandle callback = 0;

thread_local ThreadLines thread_lines;

// A str's text as UTF-8, read without the GIL (no caches filled, nothing allocated in Python).
std::string utf8_of(const PyObject* object) {
  PyObject* s = const_cast<PyObject*>(object);
  if (s == nullptr || !PyUnicode_Check(s)) {
    return "?";
  }
#if PY_VERSION_HEX < 0x030C0000
  if (!PyUnicode_IS_READY(s)) {
    return "?";
  }
#endif
  const Py_ssize_t length = PyUnicode_GET_LENGTH(s);
  if (PyUnicode_IS_COMPACT_ASCII(s)) {
    return std::string(static_cast<const char*>(PyUnicode_DATA(s)), static_cast<size_t>(length));
  }
  const int kind = PyUnicode_KIND(s);
  const void* data = PyUnicode_DATA(s);
  std::string out;
  for (Py_ssize_t i = 0; i < length; ++i) {
    const Py_UCS4 c = PyUnicode_READ(kind, data, i);
    if (c < 0x80) {
      out += static_cast<char>(c);
    } else if (c < 0x800) {
      out += static_cast<char>(0xC0 | (c >> 6));
      out += static_cast<char>(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
      out += static_cast<char>(0xE0 | (c >> 12));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (c & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (c >> 18));
      out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (c & 0x3F));
    }
  }
  return out;
}

// Prefixes come longest first, each marked '-' (not the user's) or '+' (the user's): the first
// that matches decides; a file no prefix matches is the user's.
bool is_internal(const std::string& filename) {
  for (const auto& marked : internal_prefixes) {
    if (marked.size() > 1 && filename.compare(0, marked.size() - 1, marked, 1, std::string::npos) == 0) {
      return marked[0] == '-';
    }
  }
  return false;
}

// The entry of a code object (state_mutex held). A freed code object's address can be reused, so an
// entry is trusted only while the file, name and first line it was made from still match.
const CodeEntry& code_entry(const PyCodeObject* code) {
  auto found = codes.find(code);
  if (found != codes.end() && found->second.filename == code->co_filename &&
      found->second.name == code->co_name && found->second.firstlineno == code->co_firstlineno) {
    return found->second;
  }
  std::string filename = utf8_of(code->co_filename);
  const bool internal = is_internal(filename);
  const int64_t id = static_cast<int64_t>(code_files.size());
  code_files.push_back(std::move(filename));
  code_functions.push_back(utf8_of(code->co_name));
  CodeEntry entry{code->co_filename, code->co_name, code->co_firstlineno, id, internal};
  return codes.insert_or_assign(code, entry).first->second;
}

int64_t node_of(int64_t code, int64_t line, int64_t parent) {
  const NodeKey key{code, line, parent};
  auto found = nodes.find(key);
  if (found != nodes.end()) {
    return found->second;
  }
  const int64_t id = static_cast<int64_t>(node_code.size());
  node_code.push_back(code);
  node_line.push_back(line);
  node_parent.push_back(parent);
  nodes.emplace(key, id);
  return id;
}

// The line executing at instruction `lasti` of `code`, decoded from the immutable co_linetable
// (PyCode_Addr2Line would read _co_linearray, a cache a tracing thread may be filling meanwhile).
int line_at(const PyCodeObject* code, int lasti) {
  const PyObject* table = code->co_linetable;
  if (lasti < 0 || table == nullptr || !PyBytes_Check(table)) {
    return code->co_firstlineno;
  }
  PyCodeAddressRange range;
  range.opaque.lo_next = reinterpret_cast<const uint8_t*>(PyBytes_AS_STRING(const_cast<PyObject*>(table)));
  range.opaque.limit = range.opaque.lo_next + PyBytes_GET_SIZE(const_cast<PyObject*>(table));
  range.opaque.computed_line = code->co_firstlineno;
  range.ar_start = -1;
  range.ar_end = 0;
  range.ar_line = -1;
  return _PyCode_CheckLineNumber(lasti * static_cast<int>(sizeof(_Py_CODEUNIT)), &range);
}

ThreadLines& this_thread() {
  ThreadLines& lines = thread_lines;
  const uint64_t now = session.load(std::memory_order_acquire);
  if (lines.session != now) {
    lines.session = now;
    lines.depth = 0;
    lines.last.clear();
    lines.records = std::make_shared<LineRecords>();
    lines.records->torch_tid = static_cast<int64_t>(at::RecordFunction::currentThreadId());
    std::lock_guard<std::mutex> guard(state_mutex);
    session_records.push_back(lines.records);
  }
  return lines;
}

// The thread's innermost frame: 3.13 keeps it in the thread state, 3.11 and 3.12 in its C frame.
_PyInterpreterFrame* innermost_frame(PyThreadState* state) {
#if PY_VERSION_HEX >= 0x030D0000
  return state->current_frame;
#else
  return state->cframe == nullptr ? nullptr : state->cframe->current_frame;
#endif
}

// The code a frame runs; 3.13 frames hold an "executable", a code object or None.
const PyCodeObject* code_of(_PyInterpreterFrame* f) {
#if PY_VERSION_HEX >= 0x030D0000
  return PyCode_Check(f->f_executable) ? reinterpret_cast<const PyCodeObject*>(f->f_executable) : nullptr;
#else
  return f->f_code;
#endif
}

// The stack node of the thread's current Python frames (-1 when no frame is the user's).
int64_t current_node(ThreadLines& lines) {
  PyThreadState* state = PyGILState_GetThisThreadState();
  if (state == nullptr) {
    return -1;  // a thread Python never ran on (autograd's device threads)
  }
  thread_local std::vector<WalkedFrame> walk;
  walk.clear();
  for (_PyInterpreterFrame* f = innermost_frame(state); f != nullptr; f = f->previous) {
    const PyCodeObject* code = code_of(f);
    if (code != nullptr && !_PyFrame_IsIncomplete(f)) {
      walk.push_back({f, code, _PyInterpreterFrame_LASTI(f), -1});
    }
  }
  const size_t n = walk.size();
  size_t common = 0;  // frames, from the outermost, unchanged since the previous op
  while (common < n && common < lines.last.size()) {
    const WalkedFrame& now = walk[n - 1 - common];
    const WalkedFrame& before = lines.last[common];
    if (now.frame != before.frame || now.code != before.code || now.lasti != before.lasti) {
      break;
    }
    ++common;
  }
  lines.last.resize(common);
  int64_t chain = common > 0 ? lines.last[common - 1].chain : -1;
  if (common < n) {
    std::lock_guard<std::mutex> guard(state_mutex);
    for (size_t k = common; k < n; ++k) {
      WalkedFrame frame = walk[n - 1 - k];
      const CodeEntry& entry = code_entry(frame.code);
      if (!entry.internal) {
        chain = node_of(entry.id, line_at(frame.code, frame.lasti), chain);
      }
      frame.chain = chain;
      lines.last.push_back(frame);
    }
  }
  return chain;
}

// Module ranges (`ls:<path>:<Type>`, profiler ranges in "ranges" mode) enclose ops without being
// ops: the ops inside them are the top-level ones.
bool is_module_range(const at::RecordFunction& fn) {
  const char* name = fn.name();
  return name != nullptr && name[0] == 'l' && name[1] == 's' && name[2] == ':';
}

std::unique_ptr<at::ObserverContext> on_op_start(const at::RecordFunction& fn) {
  if (is_module_range(fn)) {
    return nullptr;
  }
  ThreadLines& lines = this_thread();
  const bool top_level = lines.depth++ == 0;
  if (top_level && fn.scope() == at::RecordScope::FUNCTION) {
    const int64_t node = current_node(lines);
    if (node >= 0) {
      std::lock_guard<std::mutex> guard(lines.records->lock);
      lines.records->handles.push_back(static_cast<int64_t>(fn.handle()));
      lines.records->nodes.push_back(node);
    }
  }
  return nullptr;
}

void on_op_end(const at::RecordFunction& fn, at::ObserverContext*) {
  if (is_module_range(fn)) {
    return;
  }
  ThreadLines& lines = thread_lines;
  if (lines.session == session.load(std::memory_order_acquire) && lines.depth > 0) {
    --lines.depth;
  }
}

template <typename T>
py::bytes as_bytes(const std::vector<T>& values) {
  return py::bytes(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

#endif  // LAYERSCOPE_LINES

bool lines_supported() {
#ifdef LAYERSCOPE_LINES
  return true;
#else
  return false;
#endif
}

// Start recording call lines; `internal` holds the marked filename prefixes is_internal reads.
void lines_start(const std::vector<std::string>& internal) {
#ifdef LAYERSCOPE_LINES
  std::lock_guard<std::mutex> guard(state_mutex);
  if (callback != 0) {
    throw std::runtime_error("call lines are already being recorded");
  }
  if (internal != internal_prefixes) {
    internal_prefixes = internal;
    codes.clear();  // classified under other prefixes
  }
  session_records.clear();
  session.fetch_add(1, std::memory_order_acq_rel);
  callback = at::addGlobalCallback(
      at::RecordFunctionCallback(&on_op_start, &on_op_end)
          .needsIds(true)
          .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
#else
  throw std::runtime_error("call lines need CPython 3.11 or 3.12");
#endif
}

// The records so far, taken (recording goes on): per thread (torch thread id, handles, nodes), and
// the node and code tables (node_code, node_line, node_parent as int64 bytes; files and functions by
// code id; both only grow, so earlier ids stay valid).
py::tuple lines_take() {
#ifdef LAYERSCOPE_LINES
  // Copied under the locks, turned into Python objects after: making them can run the GC, whose
  // finalizers may call ops, whose callback takes these locks.
  std::vector<std::tuple<int64_t, std::vector<int64_t>, std::vector<int64_t>>> taken;
  std::vector<int64_t> codes_of_nodes, lines_of_nodes, parents_of_nodes;
  std::vector<std::string> files, functions;
  {
    std::lock_guard<std::mutex> guard(state_mutex);
    for (const auto& r : session_records) {
      std::lock_guard<std::mutex> records_guard(r->lock);
      if (!r->handles.empty()) {
        taken.emplace_back(r->torch_tid, std::move(r->handles), std::move(r->nodes));
        r->handles.clear();
        r->nodes.clear();
      }
    }
    codes_of_nodes = node_code;
    lines_of_nodes = node_line;
    parents_of_nodes = node_parent;
    files = code_files;
    functions = code_functions;
  }
  py::list threads;
  for (const auto& [tid, handles, nodes_of_ops] : taken) {
    threads.append(py::make_tuple(tid, as_bytes(handles), as_bytes(nodes_of_ops)));
  }
  return py::make_tuple(threads, as_bytes(codes_of_nodes), as_bytes(lines_of_nodes), as_bytes(parents_of_nodes),
                        py::cast(files), py::cast(functions));
#else
  return py::make_tuple(py::list(), py::bytes(), py::bytes(), py::bytes(), py::list(), py::list());
#endif
}

// Stop recording (the records stay until taken).
void lines_stop() {
#ifdef LAYERSCOPE_LINES
  std::lock_guard<std::mutex> guard(state_mutex);
  if (callback != 0) {
    at::removeCallback(callback);
    callback = 0;
  }
#endif
}

// The sequence number the next autograd node made on this thread will get (NVTX ranges: the nodes
// a module call created are those numbered from here on).
int64_t sequence_peek() {
  return static_cast<int64_t>(at::sequence_number::peek());
}

}  // namespace

void register_functions(py::module_& m) {
  m.def("sequence_peek", &sequence_peek);
  m.def("lines_supported", &lines_supported);
  m.def("lines_start", &lines_start, py::arg("internal_prefixes"));
  m.def("lines_take", &lines_take);
  m.def("lines_stop", &lines_stop);
}

}  // namespace layerscope_lines
