// layerscope's trace-file reader: a Chrome trace (torch.profiler / Kineto JSON) into columns, in one
// pass over the bytes, with no Python object per event.
//
// The Python path (events/stream.py + events/chrome.py) makes a dict per event with orjson and then
// reads it field by field: ~25 MB/s. This is a hand-written JSON scanner that knows the shape of
// trace events: it reads the top-level object, streams the traceEvents array, and of each event keeps
// only what TraceTableBuilder keeps (ph, cat, name, pid, tid, ts, dur, id and a few args), skipping
// everything else without decoding it. Names, pid/tid pairs and the raw JSON of shapes, concrete
// inputs and input types are interned, so Python sees each distinct one once
// (events/native_trace.py turns this into the same EventTable the Python path makes).
//
// It declines (and the Python path reads the file) whenever a value is not of the type the Python
// path would read without remark: a string timestamp, a float id, a missing "ts", a cut file, a file
// that is not a trace object. So whatever it accepts, the two paths read identically, and everything
// odd keeps the Python path's exact behaviour (malformed events counted, strict mode, cut files).
//
// Bytes arrive by feed() (Python reads the file and decompresses .gz); feed releases the GIL, so a
// decompressing thread runs beside it. Built by capture/native.py into its own extension module
// that does not link torch (pybind11's headers come from torch's include folder at build time only),
// so reading a trace never imports torch.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace py = pybind11;

namespace {

// `k` equals the literal `lit`: a compare of a constant size, which the compiler inlines (a plain
// string_view == calls memcmp: a call per key of every event).
template <size_t N>
inline bool eq(std::string_view k, const char (&lit)[N]) {
  return k.size() == N - 1 && __builtin_memcmp(k.data(), lit, N - 1) == 0;
}

struct NeedMore {};  // the buffer ends inside the unit being parsed: wait for the next feed
struct Decline {
  std::string why;
};

enum Tag : uint8_t { ABSENT, NUL, INT, FLT, STR, BOOL, ARR, OBJ, BIG };

// One JSON value as the scanner saw it: numbers parsed, strings and containers as raw ranges.
struct Val {
  Tag tag = ABSENT;
  bool escaped = false;  // a string holding backslash escapes (decoded only when used)
  bool truthy = false;   // BOOL: its value; ARR/OBJ: non-empty
  int64_t i = 0;
  double d = 0;      // FLT: the value, unless `milli` holds it exactly
  bool has_milli = false;  // FLT: `milli` is the value times 1000, exactly (d not parsed)
  int64_t milli = 0;
  const char* b = nullptr;  // STR: the characters between the quotes; others: the whole value
  size_t n = 0;
  std::string_view view() const { return {b, n}; }
};

// The kinds of EventKind (events/table.py), by trace category, as chrome.py's _KIND_BY_CATEGORY.
int kind_of(std::string_view cat) {
  static const std::unordered_map<std::string_view, int> kinds = {
      {"cpu_op", 0},        {"operator", 0},         {"Operator", 0},         {"Runtime", 2},
      {"Kernel", 4},        {"user_annotation", 1},  {"cuda_runtime", 2},     {"cuda_driver", 2},
      {"runtime", 2},       {"privateuse1_runtime", 2}, {"mtia_runtime", 2},  {"mtia_ccp_events", 4},
      {"xpu_runtime", 2},   {"python_function", 3},  {"kernel", 4},           {"gpu_memcpy", 5},
      {"Memcpy", 5},        {"gpu_memset", 6},       {"Memset", 6},           {"gpu_user_annotation", 7},
      {"cuda_sync", 7}};
  auto found = kinds.find(cat);
  return found == kinds.end() ? -1 : found->second;
}
constexpr int CPU_OP = 0, USER_ANNOTATION = 1, RUNTIME = 2, PYTHON = 3, MEMCPY = 5;
constexpr int64_t INT_LIMIT = int64_t(1) << 62;  // chrome.py's _INT_LIMIT

// Args keys the reader keeps (the order of Event::arg).
enum Arg {
  A_SEQ, A_FWD, A_CORR, A_EXT, A_DIMS, A_CONC, A_TYPES, A_FLOPS, A_PYID, A_PYPARENT, A_BYTES_LOWER,
  A_WAIT_STREAM, A_WAIT_CORR, A_RFID, A_DEVTYPE, A_TOTAL, A_BYTES, A_ADDR, A_COUNT
};
// A switch on length and a comparison, not a hash: most events carry several args keys.
int arg_of(std::string_view k) {
  switch (k.size()) {
    case 4: return eq(k, "Addr") ? A_ADDR : -1;
    case 5:
      if (eq(k, "flops")) return A_FLOPS;
      if (eq(k, "bytes")) return A_BYTES_LOWER;
      return eq(k, "Bytes") ? A_BYTES : -1;
    case 9: return eq(k, "Python id") ? A_PYID : -1;
    case 10:
      if (eq(k, "Input Dims")) return A_DIMS;
      return eq(k, "Input type") ? A_TYPES : -1;
    case 11:
      if (eq(k, "correlation")) return A_CORR;
      if (eq(k, "External id")) return A_EXT;
      return eq(k, "Device Type") ? A_DEVTYPE : -1;
    case 13: return eq(k, "Fwd thread id") ? A_FWD : -1;
    case 14: return eq(k, "wait_on_stream") ? A_WAIT_STREAM : -1;
    case 15:
      if (eq(k, "Sequence number")) return A_SEQ;
      if (eq(k, "Concrete Inputs")) return A_CONC;
      return eq(k, "Total Allocated") ? A_TOTAL : -1;
    case 16: return eq(k, "Python parent id") ? A_PYPARENT : -1;
    case 18: return eq(k, "Record function id") ? A_RFID : -1;
    case 33: return eq(k, "wait_on_cuda_event_record_corr_id") ? A_WAIT_CORR : -1;
    default: return -1;
  }
}

struct Event {
  Val ph, cat, name, pid, tid, ts, dur, id, args;
  Val arg[A_COUNT];
};

struct SvHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
using Interner = std::unordered_map<std::string, int32_t, SvHash, std::equal_to<>>;

int32_t intern(Interner& map, std::vector<std::string>& list, std::string_view text) {
  auto found = map.find(text);
  if (found != map.end()) return found->second;
  int32_t id = static_cast<int32_t>(list.size());
  list.emplace_back(text);
  map.emplace(std::string(text), id);
  return id;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

uint32_t hex4(const char* p) {
  uint32_t v = 0;
  for (int k = 0; k < 4; ++k) {
    char c = p[k];
    v <<= 4;
    if (c >= '0' && c <= '9') v |= c - '0';
    else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
    else throw Decline{"bad \\u escape"};
  }
  return v;
}

// A JSON string's characters (escapes already checked by the scanner) decoded to UTF-8.
std::string decode(const Val& v) {
  if (!v.escaped) return std::string(v.b, v.n);
  std::string out;
  out.reserve(v.n);
  for (size_t k = 0; k < v.n; ++k) {
    char c = v.b[k];
    if (c != '\\') {
      out += c;
      continue;
    }
    char e = v.b[++k];
    switch (e) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'u': {
        uint32_t cp = hex4(v.b + k + 1);
        k += 4;
        if (cp >= 0xD800 && cp < 0xDC00 && k + 6 < v.n && v.b[k + 1] == '\\' && v.b[k + 2] == 'u') {
          uint32_t low = hex4(v.b + k + 3);
          if (low < 0xDC00 || low >= 0xE000) throw Decline{"lone surrogate"};
          cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          k += 6;
        } else if (cp >= 0xD800 && cp < 0xE000) {
          throw Decline{"lone surrogate"};
        }
        append_utf8(out, cp);
        break;
      }
      default: out += e;  // \" \\ \/
    }
  }
  return out;
}


// Fewer bytes a span than any trace seen (shared traces: 300-2400), so the reserve rarely falls short.
constexpr int64_t BYTES_PER_SPAN = 256;

// A column handed to Python without a copy: a read-only numpy array over the vector's own buffer,
// which the array now owns (`v` is left empty). Copying into bytes faulted in and wrote every
// column a second time at finish, with both copies resident.
template <typename T>
py::array column_of(std::vector<T>& v) {
  auto* owned = new std::vector<T>(std::move(v));
  std::vector<T>().swap(v);
  py::capsule free_it(owned, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  py::array_t<T> out({static_cast<py::ssize_t>(owned->size())}, {static_cast<py::ssize_t>(sizeof(T))},
                     owned->data(), free_it);
  py::detail::array_proxy(out.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return std::move(out);
}

// A pid, tid or flow id as the key Python would use: an int, a string or None (anything else declines).
std::string id_key(const Val& v) {
  switch (v.tag) {
    case ABSENT:
    case NUL: return "n";
    case INT: return "i" + std::to_string(v.i);
    case STR: {
      std::string text = decode(v);
      // the thread key joins pid and tid with a NUL: one inside would split it wrongly
      if (text.find('\0') != std::string::npos) throw Decline{"a NUL in a pid, tid or flow id"};
      return "s" + text;
    }
    default: throw Decline{"a pid, tid or flow id that is not an int or a string"};
  }
}

py::object id_object(const std::string& key) {
  if (key[0] == 'n') return py::none();
  if (key[0] == 'i') return py::int_(std::stoll(key.substr(1)));
  return py::str(key.substr(1));
}

class TraceReader {
 public:
  // `expect_bytes`: the trace's size when known (0 if not). The span columns reserve room for the
  // spans such a file holds (traces run ~300-600 bytes a span), so they do not grow by doubling: each
  // growth faults in fresh pages and copies what came before, and the old and new buffers are both
  // resident while it does. Room reserved but never filled is never touched, so costs no memory.
  TraceReader(bool flops_arg, int64_t expect_bytes) : flops_arg_(flops_arg) {
    const size_t spans = expect_bytes > 0 ? size_t(expect_bytes / BYTES_PER_SPAN) : 0;
    for (auto* column : {&ts_, &dur_, &seq_, &fwd_, &corr_, &ext_, &flops_, &kind_, &tid_}) column->reserve(spans);
    for (auto* column : {&name_, &dims_, &types_, &call_}) column->reserve(spans);
  }

  // Parse what `chunk` completes; the bytes of an unfinished unit wait for the next feed. Units are
  // parsed in the chunk itself: only the unfinished unit's bytes are copied (and what it takes from
  // the next chunk to finish it).
  void feed(py::buffer chunk) {
    py::buffer_info info = chunk.request();
    if (!why_.empty()) return;
    const char* data = static_cast<const char*>(info.ptr);
    size_t n = size_t(info.size), off = 0;
    py::gil_scoped_release release;
    if (!buf_.empty()) {
      size_t old = buf_.size(), taken = 0;
      for (;;) {
        size_t more = std::min(n - taken, std::max<size_t>(taken, 1 << 16));
        buf_.append(data + taken, more);
        taken += more;
        size_t used = run(buf_.data(), buf_.size());
        if (!why_.empty()) return;
        if (used >= old) {  // the unfinished unit is done: go on in the chunk
          off = used - old;
          buf_.clear();
          break;
        }
        if (taken == n) {
          buf_.erase(0, used);
          return;
        }
      }
    }
    size_t used = run(data + off, n - off);
    if (why_.empty()) buf_.assign(data + off + used, n - off - used);
  }

  // Stop early (the caller gave up): the reason is kept for finish().
  bool declined() const { return !why_.empty(); }

  // The columns as a dict of bytes and lists, or the reason the reader declines (a str).
  py::object finish();

 private:
  enum State { START, KEYS_FIRST, KEYS_NEXT, EVENTS_FIRST, EVENTS_NEXT, DONE };

  // Parse the units complete in [base, base + n); returns how many bytes they took.
  size_t run(const char* base, size_t n) {
    end_ = base + n;
    const char* p = base;
    try {
      while (state_ != DONE) {
        const char* unit = p;
        try {
          p = step(p);
        } catch (const NeedMore&) {
          p = unit;
          break;
        }
      }
      if (state_ == DONE) {
        for (; p < end_; ++p)
          if (*p != ' ' && *p != '\n' && *p != '\r' && *p != '\t') throw Decline{"content after the trace object"};
      }
    } catch (const Decline& d) {
      why_ = d.why.empty() ? "declined" : d.why;
      buf_.clear();
      return 0;
    }
    return size_t(p - base);
  }

  const char* ws(const char* p) const {
    if (p < end_ && static_cast<unsigned char>(*p) > ' ') return p;  // most often: no space at all
    for (;; ++p) {
      if (p >= end_) throw NeedMore{};
      char c = *p;
      if (c != ' ' && c != '\n' && c != '\r' && c != '\t') return p;
    }
  }

  // One unit of the document: the opening brace, a top-level member, one event, or a closing bracket.
  const char* step(const char* p) {
    p = ws(p);
    switch (state_) {
      case START:
        if (*p != '{') throw Decline{"not a JSON object"};
        state_ = KEYS_FIRST;
        return p + 1;
      case KEYS_FIRST:
      case KEYS_NEXT:
        if (*p == '}') {
          if (!seen_events_) throw Decline{"no traceEvents array"};
          state_ = DONE;
          return p + 1;
        }
        if (state_ == KEYS_NEXT) {
          if (*p != ',') throw Decline{"bad separator between top-level keys"};
          p = ws(p + 1);
        }
        return member(p);
      case EVENTS_FIRST:
      case EVENTS_NEXT:
        if (*p == ']') {
          state_ = KEYS_NEXT;
          return p + 1;
        }
        if (state_ == EVENTS_NEXT) {
          if (*p != ',') throw Decline{"bad separator in traceEvents"};
          p = ws(p + 1);
        }
        p = event(p);
        state_ = EVENTS_NEXT;
        return p;
      default: return p;
    }
  }

  const char* member(const char* p);
  const char* event(const char* p);
  const char* value(const char* p, Val& v);
  const char* string(const char* p, Val& v);
  const char* number(const char* p, Val& v);
  const char* skip_container(const char* p, int depth);
  const char* fields(const char* p, Event& ev, bool in_args);
  void keep(const Event& ev);
  void keep_span(const Event& ev, int kind);
  void keep_memory(const Event& ev, bool oom);
  int32_t thread(const Event& ev);
  int64_t ns(const Val& v) const;

  bool flops_arg_;
  std::string buf_;
  const char* end_ = nullptr;
  State state_ = START;
  bool seen_events_ = false;
  std::string why_;
  std::string header_ = "{";  // the top-level members other than traceEvents, as one JSON object
  int64_t skipped_ = 0;

  // span columns
  // kind and tid are int64 as the EventTable keeps them (Python takes them without a copy)
  std::vector<int64_t> ts_, dur_, seq_, fwd_, corr_, ext_, flops_, kind_, tid_;
  std::vector<int32_t> name_, dims_, types_, call_;
  // each distinct (name, shapes, concrete inputs) of an op with shapes: what FLOPs are counted per
  struct Call {
    int32_t name, dims, conc;
    bool operator==(const Call& o) const { return name == o.name && dims == o.dims && conc == o.conc; }
  };
  struct CallHash {
    size_t operator()(const Call& c) const noexcept {
      return std::hash<uint64_t>{}((uint64_t(uint32_t(c.name)) << 32 | uint32_t(c.dims)) * 31 + uint32_t(c.conc));
    }
  };
  std::unordered_map<Call, int32_t, CallHash> calls_map_;
  std::vector<int32_t> calls_;  // name, dims, concrete per call id
  std::vector<int64_t> handle_span_, handle_;
  std::vector<int64_t> py_span_, py_id_, py_parent_;  // INT64_MIN: None
  std::vector<int64_t> sync_span_, sync_stream_, sync_corr_;
  std::vector<int64_t> comms_span_;
  std::vector<std::string> comms_args_;
  std::vector<int32_t> copy_name_;  // memcpy bytes by name, in the order names first copied
  std::vector<int64_t> copy_bytes_;
  // memory columns
  std::vector<int64_t> mem_ts_, mem_bytes_, mem_addr_, mem_total_, mem_tid_;
  std::vector<uint8_t> mem_device_, mem_has_total_;
  std::vector<int64_t> oom_;  // tid, ts, requested, on_device, allocated per refused allocation
  // fwdbwd flows
  std::vector<int64_t> flow_start_, flow_tid_, flow_ts_;
  std::vector<int32_t> flow_key_;  // each flow's id, numbered in the order ids first appear
  Interner flow_map_;
  std::vector<std::string> flow_ids_;  // the distinct ids (id_key form)
  // interned text
  Interner names_map_, dims_map_, conc_map_, types_map_, threads_map_;
  struct PairHash {
    size_t operator()(const std::pair<int64_t, int64_t>& k) const noexcept {
      return std::hash<int64_t>{}(k.first * 1000003 ^ k.second);
    }
  };
  std::unordered_map<std::pair<int64_t, int64_t>, int32_t, PairHash> int_threads_;
  std::vector<std::string> names_, dims_text_, conc_text_, types_text_, threads_;
};

const char* TraceReader::member(const char* p) {
  Val key;
  const char* after = string(p, key);
  if (key.escaped) throw Decline{"escaped top-level key"};
  const char* colon = ws(after);
  if (*colon != ':') throw Decline{"no colon after a top-level key"};
  const char* v = ws(colon + 1);
  if (key.view() == "traceEvents" && *v == '[') {
    if (seen_events_) throw Decline{"two traceEvents arrays"};
    seen_events_ = true;
    state_ = EVENTS_FIRST;
    return v + 1;
  }
  // A saved layerscope profile is read whole by the Python path: decline before scanning it.
  if (key.view() == "format") throw Decline{"a saved profile, not a trace"};
  Val skipped;
  const char* done = value(v, skipped);
  if (done >= end_) throw NeedMore{};  // a number at the buffer's end may go on
  if (header_.size() > 1) header_ += ',';
  header_.append(p, size_t(after - p));
  header_ += ':';
  header_.append(v, size_t(done - v));
  state_ = KEYS_NEXT;
  return done;
}

// Whether [p, p + n) is valid UTF-8 (orjson refuses anything else, so the reader declines it).
bool valid_utf8(const unsigned char* p, size_t n) {
  static const uint32_t least[] = {0, 0x80, 0x800, 0x10000};
  for (size_t k = 0; k < n;) {
    unsigned char c = p[k];
    if (c < 0x80) {
      ++k;
      continue;
    }
    size_t extra = (c >> 5) == 0x6 ? 1 : (c >> 4) == 0xE ? 2 : (c >> 3) == 0x1E ? 3 : 0;
    if (extra == 0) return false;
    uint32_t cp = c & (0x3F >> extra);
    for (size_t j = 1; j <= extra; ++j) {
      if (k + j >= n || (p[k + j] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[k + j] & 0x3F);
    }
    if (cp < least[extra] || cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000)) return false;
    k += extra + 1;
  }
  return true;
}

const char* TraceReader::string(const char* p, Val& v) {
  if (*p != '"') throw Decline{"expected a string"};
  const char* s = ++p;
  bool escaped = false;
  unsigned char high = 0;
  for (;;) {
#if defined(__SSE2__)
    // sixteen plain bytes at a time: no quote, backslash, control or non-ASCII byte among them (a
    // signed compare below 0x20 takes both the control bytes and those with the high bit set)
    while (p + 16 <= end_) {
      __m128i w = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
      __m128i special = _mm_or_si128(
          _mm_or_si128(_mm_cmpeq_epi8(w, _mm_set1_epi8('"')), _mm_cmpeq_epi8(w, _mm_set1_epi8('\\'))),
          _mm_cmplt_epi8(w, _mm_set1_epi8(0x20)));
      unsigned mask = unsigned(_mm_movemask_epi8(special));
      if (mask) {
        p += __builtin_ctz(mask);
        goto special_byte;
      }
      p += 16;
    }
#endif
    // eight plain bytes at a time: no quote, backslash, control or non-ASCII byte among them
    while (p + 8 <= end_) {
      uint64_t w;
      std::memcpy(&w, p, 8);
      constexpr uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
      uint64_t quote = w ^ (ones * '"'), slash = w ^ (ones * '\\');
      uint64_t special = ((quote - ones) & ~quote) | ((slash - ones) & ~slash) | (w - ones * 0x20) | w;
      if (special & highs) break;
      p += 8;
    }
    if (p >= end_) throw NeedMore{};
  special_byte:
    unsigned char c = static_cast<unsigned char>(*p);
    if (c == '"') break;
    if (c < 0x20) throw Decline{"a control character in a string"};
    high |= c;
    if (c == '\\') {
      escaped = true;
      if (p + 1 >= end_) throw NeedMore{};
      if (p[1] == 'u') {
        if (p + 6 > end_) throw NeedMore{};
        hex4(p + 2);
        p += 6;
      } else {
        if (!std::strchr("\"\\/bfnrt", p[1])) throw Decline{"bad escape"};
        p += 2;
      }
      continue;
    }
    ++p;
  }
  v.tag = STR;
  v.escaped = escaped;
  v.b = s;
  v.n = size_t(p - s);
  v.truthy = v.n > 0;
  if ((high & 0x80) && !valid_utf8(reinterpret_cast<const unsigned char*>(s), v.n))
    throw Decline{"a string that is not valid UTF-8"};
  if (escaped) decode(v);  // declines on lone surrogates, as orjson refuses them
  return p + 1;
}

// A JSON number, checked against JSON's grammar (orjson refuses "01", "1.", "1e"): an int64, a big
// integer (BIG: orjson reads it, as an int up to 2**64 and a float beyond, but no int64 column can
// hold it) or a double.
const char* TraceReader::number(const char* p, Val& v) {
  const char* s = p;
  v.has_milli = false;  // a key met twice: its second value must not read the first one's time
  // the digits from q on, and their value (wrapping past 19 digits: only used for fewer)
  auto digits = [&](const char* q, uint64_t& value) {
    const char* start = q;
    value = 0;
    for (;; ++q) {
      if (q >= end_) throw NeedMore{};
      unsigned digit = unsigned(static_cast<unsigned char>(*q)) - '0';
      if (digit > 9) break;
      value = value * 10 + digit;
    }
    if (q == start) throw Decline{"bad number"};
    return q;
  };
  bool negative = *p == '-';
  if (negative) ++p;
  if (p >= end_) throw NeedMore{};
  const char* int_start = p;
  uint64_t whole = 0, fraction = 0, ignored = 0;
  p = digits(p, whole);
  size_t int_digits = size_t(p - int_start), fraction_digits = 0;
  if (*int_start == '0' && int_digits > 1) throw Decline{"a number with a leading zero"};
  bool is_float = false, exponent = false;
  if (*p == '.') {
    is_float = true;
    const char* f = p + 1;
    p = digits(f, fraction);
    fraction_digits = size_t(p - f);
  }
  if (*p == 'e' || *p == 'E') {
    is_float = exponent = true;
    ++p;
    if (p >= end_) throw NeedMore{};
    if (*p == '+' || *p == '-') ++p;
    p = digits(p, ignored);
  }
  v.b = s;
  v.n = size_t(p - s);
  if (!is_float) {
    if (int_digits <= 18) {  // exact in the accumulated value
      v.i = negative ? -int64_t(whole) : int64_t(whole);
      v.tag = INT;
    } else {
      auto [end, ec] = std::from_chars(s, p, v.i);
      v.tag = ec == std::errc() ? INT : BIG;
    }
    v.truthy = v.tag == BIG || v.i != 0;
    return p;
  }
  v.tag = FLT;
  // Kineto's times: microseconds with at most 3 decimals. Below 2**43 us a double's spacing is under
  // a thousandth, so ns()'s floor-and-round of the parsed double gives exactly whole * 1000 +
  // fraction: keep that and skip parsing the double.
  if (!exponent && fraction_digits <= 3 && int_digits <= 13 && whole < (uint64_t(1) << 43)) {
    for (size_t k = fraction_digits; k < 3; ++k) fraction *= 10;
    int64_t milli = int64_t(whole * 1000 + fraction);
    v.milli = negative ? -milli : milli;
    v.has_milli = true;
    v.truthy = milli != 0;
    return p;
  }
  auto [end, ec] = std::from_chars(s, p, v.d);
  if (ec != std::errc() || end != p) throw Decline{"a number out of a double's range"};
  v.truthy = v.d != 0;
  return p;
}

// A whole array or object, checked against JSON's grammar but not kept.
const char* TraceReader::skip_container(const char* p, int depth) {
  if (depth > 256) throw Decline{"nested too deeply"};
  char close = *p == '{' ? '}' : ']';
  bool object = close == '}';
  p = ws(p + 1);
  if (*p == close) return p + 1;
  for (;;) {
    Val ignored;
    if (object) {
      p = ws(string(p, ignored));
      if (*p != ':') throw Decline{"no colon after a key"};
      p = ws(p + 1);
    }
    p = (*p == '{' || *p == '[') ? skip_container(p, depth + 1) : value(p, ignored);
    p = ws(p);
    if (*p == close) return p + 1;
    if (*p != ',') throw Decline{"bad separator"};
    p = ws(p + 1);
  }
}

const char* TraceReader::value(const char* p, Val& v) {
  switch (*p) {
    case '"': return string(p, v);
    case '{':
    case '[': {
      const char* done = skip_container(p, 0);
      v.tag = *p == '{' ? OBJ : ARR;
      v.b = p;
      v.n = size_t(done - p);
      v.truthy = *ws(p + 1) != (*p == '{' ? '}' : ']');
      return done;
    }
    case 't':
    case 'f':
    case 'n': {
      const char* word = *p == 't' ? "true" : *p == 'f' ? "false" : "null";
      size_t n = std::strlen(word);
      if (p + n > end_) throw NeedMore{};
      if (std::memcmp(p, word, n) != 0) throw Decline{"bad literal"};
      v.tag = *p == 'n' ? NUL : BOOL;
      v.truthy = *p == 't';
      v.b = p;
      v.n = n;
      return p + n;
    }
    default:
      if (*p == '-' || (*p >= '0' && *p <= '9')) return number(p, v);
      throw Decline{"bad value"};
  }
}

// The event-level keys the reader keeps (numbers: their place in Event).
int event_key(std::string_view k) {
  switch (k.size()) {
    case 2:
      if (eq(k, "ph")) return 0;
      if (eq(k, "ts")) return 5;
      if (eq(k, "id")) return 7;
      return -1;
    case 3:
      if (eq(k, "cat")) return 1;
      if (eq(k, "pid")) return 3;
      if (eq(k, "tid")) return 4;
      if (eq(k, "dur")) return 6;
      return -1;
    case 4:
      if (eq(k, "name")) return 2;
      if (eq(k, "args")) return 8;
      return -1;
    default: return -1;
  }
}

const char* TraceReader::fields(const char* p, Event& ev, bool in_args) {
  // p is just after the object's '{'
  p = ws(p);
  if (*p == '}') return p + 1;
  for (;;) {
    Val key;
    p = string(ws(p), key);
    if (key.escaped) throw Decline{"escaped key in an event"};
    p = ws(p);
    if (*p != ':') throw Decline{"no colon after a key"};
    p = ws(p + 1);
    if (in_args) {
      int which = arg_of(key.view());
      if (which >= 0) {
        p = value(p, ev.arg[which]);
      } else {
        Val ignored;
        p = value(p, ignored);
      }
    } else {
      int which = event_key(key.view());
      if (which == 8) {
        for (Val& a : ev.arg) a = Val{};
        if (*p == '{') {
          const char* start = p;
          p = fields(p + 1, ev, true);
          ev.args.tag = OBJ;
          ev.args.b = start;
          ev.args.n = size_t(p - start);
        } else {
          p = value(p, ev.args);
        }
      } else {
        Val* slots[] = {&ev.ph, &ev.cat, &ev.name, &ev.pid, &ev.tid, &ev.ts, &ev.dur, &ev.id};
        Val ignored;
        p = value(p, which >= 0 ? *slots[which] : ignored);
      }
    }
    p = ws(p);
    if (*p == '}') return p + 1;
    if (*p != ',') throw Decline{"bad separator in an object"};
    ++p;
  }
}

const char* TraceReader::event(const char* p) {
  if (*p != '{') {  // not an event object: the Python path skips and counts it too
    Val ignored;
    p = value(p, ignored);
    if (p >= end_) throw NeedMore{};
    ++skipped_;
    return p;
  }
  Event ev;
  p = fields(p + 1, ev, false);
  keep(ev);
  return p;
}

// chrome.py's _int: in (-2**62, 2**62), else the event is malformed (the Python path counts it).
int64_t checked(int64_t v) {
  if (v <= -INT_LIMIT || v >= INT_LIMIT) throw Decline{"an integer out of range"};
  return v;
}

// `_int(args.get(key, 0) or 0)`: missing, null, false and 0 are 0.
int64_t int_or0(const Val& v) {
  if (v.tag == ABSENT || v.tag == NUL || (v.tag == BOOL && !v.truthy)) return 0;
  if (v.tag != INT) throw Decline{"a non-integer where an integer belongs"};
  return checked(v.i);
}

// `_int(args.get(key, fallback))`: only a missing key takes the fallback.
int64_t int_default(const Val& v, int64_t fallback) {
  if (v.tag == ABSENT) return fallback;
  if (v.tag != INT) throw Decline{"a non-integer where an integer belongs"};
  return checked(v.i);
}

// chrome.py's _ns: microseconds to integer nanoseconds, whole microseconds exactly and the fraction
// rounded half to even (Python's round), so the two paths agree to the nanosecond.
int64_t TraceReader::ns(const Val& v) const {
  if (v.tag == INT) {
    if (v.i <= -INT_LIMIT / 1000 || v.i >= INT_LIMIT / 1000) throw Decline{"a time out of range"};
    return v.i * 1000;
  }
  if (v.tag == FLT && v.has_milli) return checked(v.milli);
  if (v.tag != FLT || !(std::fabs(v.d) < 4.0e15)) throw Decline{"a time that is not a number"};
  double whole = std::floor(v.d);
  return checked(int64_t(whole) * 1000 + int64_t(std::nearbyint((v.d - whole) * 1000.0)));
}

int32_t TraceReader::thread(const Event& ev) {
  // integer pid and tid (most traces): a lookup with no string made; ids shared with the other map
  if (ev.pid.tag == INT && ev.tid.tag == INT) {
    auto found = int_threads_.find({ev.pid.i, ev.tid.i});
    if (found != int_threads_.end()) return found->second;
  }
  std::string key = id_key(ev.pid);
  key += '\0';
  key += id_key(ev.tid);
  auto found = threads_map_.find(key);
  if (found != threads_map_.end()) return found->second;
  int32_t id = static_cast<int32_t>(threads_.size()) + 1;  // the Python path counts threads from 1
  threads_.push_back(key);
  threads_map_.emplace(key, id);
  if (ev.pid.tag == INT && ev.tid.tag == INT) int_threads_.emplace(std::make_pair(ev.pid.i, ev.tid.i), id);
  return id;
}

template <size_t N>
bool is(const Val& v, const char (&text)[N]) {
  return v.tag == STR && (v.escaped ? decode(v) == std::string_view(text, N - 1) : eq(v.view(), text));
}

void TraceReader::keep(const Event& ev) {
  if (is(ev.ph, "X")) {
    if (ev.cat.tag == ARR || ev.cat.tag == OBJ) throw Decline{"a category that is not a string"};
    if (ev.cat.tag != STR) return;
    int kind = kind_of(ev.cat.escaped ? std::string_view(decode(ev.cat)) : ev.cat.view());
    if (kind >= 0) keep_span(ev, kind);
  } else if (is(ev.ph, "i")) {
    if (ev.name.tag == ARR || ev.name.tag == OBJ) throw Decline{"a name that is not a string"};
    if (is(ev.name, "[memory]")) keep_memory(ev, false);
    else if (is(ev.name, "[OutOfMemory]")) keep_memory(ev, true);
  } else if ((is(ev.ph, "s") || is(ev.ph, "f")) && is(ev.cat, "fwdbwd")) {
    int32_t tid = thread(ev);
    if (ev.ts.tag == ABSENT) throw Decline{"a flow without ts"};
    flow_start_.push_back(is(ev.ph, "s"));
    flow_tid_.push_back(tid);
    flow_ts_.push_back(ns(ev.ts));
    flow_key_.push_back(intern(flow_map_, flow_ids_, id_key(ev.id)));
  }
}

// Input Dims as the Python path tests them (`if dims`): a non-empty list is kept, other truthy values
// decline, falsy ones are no shapes.
bool has_dims(const Val& v) {
  if (!v.truthy || v.tag == ABSENT || v.tag == NUL) return false;
  if (v.tag != ARR) throw Decline{"Input Dims that are not a list"};
  return true;
}

void TraceReader::keep_span(const Event& ev, int kind) {
  const Val* a = ev.arg;
  int64_t span = int64_t(ts_.size());
  int32_t tid = thread(ev);
  if (ev.ts.tag == ABSENT) throw Decline{"a span without ts"};
  int64_t ts = ns(ev.ts);
  int64_t dur = ev.dur.tag == ABSENT ? 0 : std::max<int64_t>(0, ns(ev.dur));
  if (ev.name.tag != ABSENT && ev.name.tag != STR) throw Decline{"a name that is not a string"};
  std::string decoded = ev.name.escaped ? decode(ev.name) : std::string();
  std::string_view name = ev.name.tag != STR ? std::string_view() : ev.name.escaped ? decoded : ev.name.view();
  int64_t seq = int_default(a[A_SEQ], -1);
  int64_t fwd = seq >= 0 ? int_default(a[A_FWD], 0) : 0;
  int64_t corr = kind != CPU_OP ? int_or0(a[A_CORR]) : 0;
  int64_t ext = kind != RUNTIME ? int_or0(a[A_EXT]) : 0;
  int32_t dims = -1, conc = -1, types = -1, call = -1;
  int64_t flops = 0;
  if (kind == CPU_OP) {
    if (has_dims(a[A_DIMS])) {
      dims = intern(dims_map_, dims_text_, a[A_DIMS].view());
      if (a[A_CONC].tag != ABSENT) conc = intern(conc_map_, conc_text_, a[A_CONC].view());
    }
    if (flops_arg_) flops = int_or0(a[A_FLOPS]);
    // the dtype FLOPs ran in: needed where FLOPs may be counted
    if ((dims >= 0 || flops != 0) && a[A_TYPES].tag != ABSENT)
      types = intern(types_map_, types_text_, a[A_TYPES].view());
    const Val& rf = a[A_RFID];
    if (rf.tag == INT && rf.i > 0) {
      handle_span_.push_back(span);
      handle_.push_back(rf.i);
    }
  }
  if (kind == PYTHON) {
    for (int k : {A_PYID, A_PYPARENT}) {
      const Val& v = a[k];
      if (v.tag != INT && v.tag != ABSENT && v.tag != NUL) throw Decline{"a Python id that is not an int"};
      (k == A_PYID ? py_id_ : py_parent_).push_back(v.tag == INT ? v.i : INT64_MIN);
    }
    py_span_.push_back(span);
  }
  int32_t name_id = intern(names_map_, names_, name);
  if (dims >= 0) {
    auto [at, added] = calls_map_.try_emplace(Call{name_id, dims, conc}, int32_t(calls_map_.size()));
    if (added) calls_.insert(calls_.end(), {name_id, dims, conc});
    call = at->second;
  }
  if (eq(name, "record_param_comms")) {
    comms_span_.push_back(span);
    comms_args_.push_back(ev.args.tag == OBJ ? std::string(ev.args.view()) : std::string("{}"));
  } else if (kind == MEMCPY) {
    int64_t nbytes = int_or0(a[A_BYTES_LOWER]);
    size_t k = 0;
    while (k < copy_name_.size() && copy_name_[k] != name_id) ++k;
    if (k == copy_name_.size()) {
      copy_name_.push_back(name_id);
      copy_bytes_.push_back(0);
    }
    copy_bytes_[k] += nbytes;
  } else if (a[A_WAIT_STREAM].tag != ABSENT) {
    sync_span_.push_back(span);
    sync_stream_.push_back(int_default(a[A_WAIT_STREAM], 0));
    sync_corr_.push_back(int_default(a[A_WAIT_CORR], -1));
  }
  name_.push_back(name_id);
  kind_.push_back(kind);
  tid_.push_back(tid);
  ts_.push_back(ts);
  dur_.push_back(dur);
  seq_.push_back(seq);
  fwd_.push_back(fwd);
  corr_.push_back(corr);
  ext_.push_back(ext);
  dims_.push_back(dims);
  types_.push_back(types);
  call_.push_back(call);
  flops_.push_back(flops);
}

void TraceReader::keep_memory(const Event& ev, bool oom) {
  const Val* a = ev.arg;
  bool on_device = int_or0(a[A_DEVTYPE]) != 0;
  int64_t allocated = int_or0(a[A_TOTAL]);
  if (oom) {
    int64_t requested = int_or0(a[A_BYTES]);
    int32_t tid = thread(ev);
    if (ev.ts.tag == ABSENT) throw Decline{"a memory event without ts"};
    oom_.insert(oom_.end(), {tid, ns(ev.ts), requested, on_device, allocated});
    return;
  }
  int32_t tid = thread(ev);
  if (ev.ts.tag == ABSENT) throw Decline{"a memory event without ts"};
  mem_tid_.push_back(tid);
  mem_ts_.push_back(ns(ev.ts));
  mem_bytes_.push_back(int_default(a[A_BYTES], 0));
  mem_device_.push_back(on_device);
  mem_addr_.push_back(int_or0(a[A_ADDR]));
  mem_total_.push_back(allocated);
  mem_has_total_.push_back(a[A_TOTAL].tag != ABSENT);
}

py::list str_list(const std::vector<std::string>& texts) {
  py::list out;
  for (const std::string& t : texts) out.append(py::str(t));
  return out;
}

py::list bytes_list(const std::vector<std::string>& texts) {
  py::list out;
  for (const std::string& t : texts) out.append(py::bytes(t));
  return out;
}

py::object TraceReader::finish() {
  if (why_.empty() && state_ != DONE) why_ = "the file ends before the trace does";
  if (!why_.empty()) return py::str(why_);
  py::dict out;
  try {
    out["names"] = str_list(names_);
  } catch (const py::error_already_set&) {
    return py::str("a name that is not valid UTF-8");
  }
  py::list threads;
  for (const std::string& key : threads_) {
    size_t cut = key.find('\0');
    threads.append(py::make_tuple(id_object(key.substr(0, cut)), id_object(key.substr(cut + 1))));
  }
  out["threads"] = threads;
  out["dims"] = bytes_list(dims_text_);
  out["concrete"] = bytes_list(conc_text_);
  out["types"] = bytes_list(types_text_);
  out["comms_args"] = bytes_list(comms_args_);
  out["header"] = py::bytes(header_ + "}");
  out["skipped"] = skipped_;
#define COLUMN(field, key) out[key] = column_of(field)
  COLUMN(name_, "name"); COLUMN(kind_, "kind"); COLUMN(tid_, "tid"); COLUMN(ts_, "ts");
  COLUMN(dur_, "dur"); COLUMN(seq_, "seq"); COLUMN(fwd_, "fwd"); COLUMN(corr_, "corr");
  COLUMN(ext_, "ext"); COLUMN(dims_, "dims_id");
  COLUMN(types_, "types_id"); COLUMN(flops_, "flops"); COLUMN(call_, "call_id"); COLUMN(calls_, "calls");
  COLUMN(handle_span_, "handle_span");
  COLUMN(handle_, "handle"); COLUMN(py_span_, "py_span"); COLUMN(py_id_, "py_id");
  COLUMN(py_parent_, "py_parent"); COLUMN(sync_span_, "sync_span"); COLUMN(sync_stream_, "sync_stream");
  COLUMN(sync_corr_, "sync_corr"); COLUMN(comms_span_, "comms_span"); COLUMN(copy_name_, "copy_name");
  COLUMN(copy_bytes_, "copy_bytes"); COLUMN(mem_tid_, "mem_tid"); COLUMN(mem_ts_, "mem_ts");
  COLUMN(mem_bytes_, "mem_bytes"); COLUMN(mem_device_, "mem_on_device"); COLUMN(mem_addr_, "mem_addr");
  COLUMN(mem_total_, "mem_total"); COLUMN(mem_has_total_, "mem_has_total"); COLUMN(oom_, "oom");
  COLUMN(flow_start_, "flow_start"); COLUMN(flow_tid_, "flow_tid"); COLUMN(flow_ts_, "flow_ts");
  COLUMN(flow_key_, "flow_key");
#undef COLUMN
  return out;
}

}  // namespace

namespace layerscope_nesting {
void register_functions(py::module_& m);  // native_nesting.cpp: attribution's kernels, torch-free too
}

PYBIND11_MODULE(LAYERSCOPE_TRACE_MODULE, m) {
  m.doc() = "layerscope trace reader: Chrome trace JSON into columns, one pass, no object per event";
  py::class_<TraceReader>(m, "TraceReader")
      .def(py::init<bool, int64_t>(), py::arg("flops_arg"), py::arg("expect_bytes") = 0)
      .def("feed", &TraceReader::feed, py::arg("chunk"))
      .def("declined", &TraceReader::declined)
      .def("finish", &TraceReader::finish);
  layerscope_nesting::register_functions(m);
}
