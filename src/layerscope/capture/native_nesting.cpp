// Nesting of CPU spans in one pass (attribution/nest_native.py): what attribution/nest_columns.py's
// numpy passes compute (parents, exclusive time) and nesting.py's depths and levels, identical.
//
// Spans come in time order (attribution's time_order: by start, the longest first among equal
// starts). Per thread, a stack of open spans: a span's parent is the latest earlier span on its
// thread that ends no earlier than it and after it starts, which is the top of the stack once the
// spans that end too soon are popped (a popped span can never be a later span's parent: the span
// that popped it ends later, or it ended at or before that span's start). Exclusive time: a span
// owns its instants from the latest of its start, its previous sibling's end and its parent's own
// start; its exclusive time is what it owns less what its children own. Plain int64 arrays in, no
// Python object per span; torch-free (only pybind11 and its numpy arrays).

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

namespace layerscope_nesting {
namespace {

using Int64Array = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

// int64 key -> int64 value >= 0 (-1: absent), open addressing at most half full, growing with the
// distinct keys (a few thousand addresses among a million events: a table sized by the events would
// be tens of MiB):
// the memory kernels look up one address per event, where std::unordered_map allocates a node per key.
class KeyTable {
 public:
  // room for `expected` keys up front, up to kMostUpFront (1 MiB); more come by doubling
  explicit KeyTable(size_t expected) {
    size_t capacity = 16;
    while (capacity < 2 * expected && capacity < kMostUpFront) capacity <<= 1;
    keys_.assign(capacity, 0);
    values_.assign(capacity, -1);
  }
  // the value slot of `key`, -1 when new (the caller stores a value >= 0 at once); valid until the
  // next call
  int64_t& at(int64_t key) {
    size_t slot = find_slot(key);
    if (values_[slot] < 0) {  // a new key: room first
      if (2 * (size_ + 1) > keys_.size()) {
        grow();
        slot = find_slot(key);
      }
      ++size_;
      keys_[slot] = key;
    }
    return values_[slot];
  }
  // the value of `key`, -1 when absent
  int64_t find(int64_t key) const { return values_[find_slot(key)]; }

 private:
  static constexpr size_t kMostUpFront = size_t{1} << 16;
  size_t hash(int64_t key) const {
    const uint64_t h = static_cast<uint64_t>(key) * 0x9e3779b97f4a7c15ull;
    return static_cast<size_t>(h ^ (h >> 29)) & (keys_.size() - 1);
  }
  // the key's slot, or the empty slot where it would go (occupied slots hold a value >= 0)
  size_t find_slot(int64_t key) const {
    size_t slot = hash(key);
    while (values_[slot] >= 0 && keys_[slot] != key) slot = (slot + 1) & (keys_.size() - 1);
    return slot;
  }
  void grow() {
    std::vector<int64_t> keys(keys_.size() * 2, 0), values(keys_.size() * 2, -1);
    keys.swap(keys_);
    values.swap(values_);
    for (size_t k = 0; k < keys.size(); ++k) {
      if (values[k] < 0) continue;
      const size_t slot = find_slot(keys[k]);
      keys_[slot] = keys[k];
      values_[slot] = values[k];
    }
  }
  std::vector<int64_t> keys_, values_;
  size_t size_ = 0;
};

const std::pair<std::vector<int64_t>, std::vector<int64_t>> kNoSpans;  // a thread with no spans

struct Thread {
  std::vector<int64_t> open;  // spans still open, innermost last
  int64_t last_top = -1;      // the thread's latest top-level span
};

// (parent, excl, depth, by_level, level_starts) for the spans of `order` (time order); spans not in
// it keep parent -1, their duration as exclusive time, depth 0. `by_level` is `order` grouped by
// depth (stable), level k being by_level[level_starts[k]:level_starts[k+1]].
py::tuple nest(const Int64Array& order_in, const Int64Array& tid_in, const Int64Array& ts_in,
               const Int64Array& dur_in) {
  const auto order = order_in.unchecked<1>();
  const auto tid = tid_in.unchecked<1>();
  const auto ts = ts_in.unchecked<1>();
  const auto dur = dur_in.unchecked<1>();
  const py::ssize_t count = ts.shape(0);
  if (tid.shape(0) != count || dur.shape(0) != count) {
    throw std::invalid_argument("nest: columns of different lengths");
  }
  const py::ssize_t n = order.shape(0);
  Int64Array parent_out(count), excl_out(count), depth_out(count);
  auto parent = parent_out.mutable_unchecked<1>();
  auto excl = excl_out.mutable_unchecked<1>();
  auto depth = depth_out.mutable_unchecked<1>();
  std::vector<int64_t> own(static_cast<size_t>(count));        // where each span's own time starts
  std::vector<int64_t> last_child(static_cast<size_t>(count), -1);
  std::vector<double> children(static_cast<size_t>(count), 0.0);  // summed as numpy's bincount does
  for (py::ssize_t i = 0; i < count; ++i) {
    parent(i) = -1;
    excl(i) = dur(i);
    depth(i) = 0;
  }
  std::unordered_map<int64_t, Thread> threads;
  int64_t max_depth = -1;
  for (py::ssize_t k = 0; k < n; ++k) {
    const int64_t s = order(k);
    if (s < 0 || s >= count) throw std::out_of_range("nest: span index out of range");
    const int64_t start = ts(s), end = start + dur(s);
    const int64_t need = std::max(end, start + 1);
    Thread& thread = threads[tid(s)];
    auto& open = thread.open;
    while (!open.empty() && ts(open.back()) + dur(open.back()) < need) open.pop_back();
    const int64_t p = open.empty() ? -1 : open.back();
    open.push_back(s);
    parent(s) = p;
    int64_t& previous = p >= 0 ? last_child[static_cast<size_t>(p)] : thread.last_top;
    int64_t claim = start;
    if (previous >= 0) {
      const int64_t prev_end = ts(previous) + dur(previous);
      claim = std::max(claim, std::max(ts(previous), prev_end));
    }
    previous = s;
    if (p >= 0) {
      claim = std::max(claim, own[static_cast<size_t>(p)]);
      depth(s) = depth(p) + 1;
    }
    own[static_cast<size_t>(s)] = claim;
    max_depth = std::max(max_depth, depth(s));
  }
  // own time, less the children's, in time order (the order numpy's bincount adds them in)
  std::vector<int64_t> own_ns(static_cast<size_t>(n));
  for (py::ssize_t k = 0; k < n; ++k) {
    const int64_t s = order(k);
    own_ns[static_cast<size_t>(k)] = std::max<int64_t>(ts(s) + dur(s) - own[static_cast<size_t>(s)], 0);
    if (parent(s) >= 0) children[static_cast<size_t>(parent(s))] += static_cast<double>(own_ns[static_cast<size_t>(k)]);
  }
  for (py::ssize_t k = 0; k < n; ++k) {
    const int64_t s = order(k);
    excl(s) = own_ns[static_cast<size_t>(k)];
  }
  for (py::ssize_t i = 0; i < count; ++i) {
    excl(i) -= static_cast<int64_t>(children[static_cast<size_t>(i)]);
  }
  // levels: a counting sort of `order` by depth, stable
  const auto levels = static_cast<size_t>(max_depth + 1);
  Int64Array starts_out(static_cast<py::ssize_t>(levels + 1)), by_level_out(n);
  auto starts = starts_out.mutable_unchecked<1>();
  auto by_level = by_level_out.mutable_unchecked<1>();
  std::vector<int64_t> next(levels + 1, 0);
  for (py::ssize_t k = 0; k < n; ++k) ++next[static_cast<size_t>(depth(order(k))) + 1];
  for (size_t d = 0; d < levels; ++d) next[d + 1] += next[d];
  for (size_t d = 0; d <= levels; ++d) starts(static_cast<py::ssize_t>(d)) = next[d];
  for (py::ssize_t k = 0; k < n; ++k) {
    const int64_t s = order(k);
    by_level(next[static_cast<size_t>(depth(s))]++) = s;
  }
  return py::make_tuple(parent_out, excl_out, depth_out, by_level_out, starts_out);
}

// np.unique(keys, return_index=True, return_inverse=True) of an int64 column, by hashing: the
// distinct keys sorted, each one's first position, and each key's place among them. One pass with an
// open-addressing table, then a sort of the distinct keys only (numpy sorts all of them).
py::tuple group(const Int64Array& keys_in) {
  const auto keys = keys_in.unchecked<1>();
  const py::ssize_t n = keys.shape(0);
  // The table grows with the distinct keys, not with n: most columns grouped (names, shapes, FLOP
  // counts) have a few thousand distinct keys among millions, and a table that fits in cache is
  // probed ~5x faster than one sized 2n (64 MiB at 4M spans, a cache miss a key).
  size_t capacity = 1024;
  size_t mask = capacity - 1;
  std::vector<int64_t> slot_of(capacity, -1);  // table slot -> distinct key's number (first-seen)
  std::vector<int64_t> distinct, first;
  std::vector<int64_t> seen(static_cast<size_t>(n));  // each key's distinct number
  const auto slot = [&](int64_t key) {
    uint64_t h = static_cast<uint64_t>(key) * 0x9e3779b97f4a7c15ull;
    return static_cast<size_t>(h ^ (h >> 29)) & mask;
  };
  for (py::ssize_t i = 0; i < n; ++i) {
    const int64_t key = keys(i);
    size_t at = slot(key);
    while (true) {
      const int64_t found = slot_of[at];
      if (found < 0) {
        slot_of[at] = static_cast<int64_t>(distinct.size());
        seen[static_cast<size_t>(i)] = static_cast<int64_t>(distinct.size());
        distinct.push_back(key);
        first.push_back(i);
        if (distinct.size() * 2 > capacity) {  // at most half full: rehash the distinct keys, doubled
          capacity <<= 1;
          mask = capacity - 1;
          slot_of.assign(capacity, -1);
          for (size_t k = 0; k < distinct.size(); ++k) {
            size_t to = slot(distinct[k]);
            while (slot_of[to] >= 0) to = (to + 1) & mask;
            slot_of[to] = static_cast<int64_t>(k);
          }
        }
        break;
      }
      if (distinct[static_cast<size_t>(found)] == key) {
        seen[static_cast<size_t>(i)] = found;
        break;
      }
      at = (at + 1) & mask;
    }
  }
  const size_t m = distinct.size();
  std::vector<int64_t> by_value(m);
  for (size_t k = 0; k < m; ++k) by_value[k] = static_cast<int64_t>(k);
  std::sort(by_value.begin(), by_value.end(),
            [&](int64_t a, int64_t b) { return distinct[static_cast<size_t>(a)] < distinct[static_cast<size_t>(b)]; });
  std::vector<int64_t> rank(m);
  Int64Array uniq_out(static_cast<py::ssize_t>(m)), first_out(static_cast<py::ssize_t>(m)), inverse_out(n);
  auto uniq = uniq_out.mutable_unchecked<1>();
  auto firsts = first_out.mutable_unchecked<1>();
  auto inverse = inverse_out.mutable_unchecked<1>();
  for (size_t r = 0; r < m; ++r) {
    const auto k = static_cast<size_t>(by_value[r]);
    rank[k] = static_cast<int64_t>(r);
    uniq(static_cast<py::ssize_t>(r)) = distinct[k];
    firsts(static_cast<py::ssize_t>(r)) = first[k];
  }
  for (py::ssize_t i = 0; i < n; ++i) inverse(i) = rank[static_cast<size_t>(seen[static_cast<size_t>(i)])];
  return py::make_tuple(uniq_out, first_out, inverse_out);
}

// nesting.inclusive: per span its own value plus all nested spans', children added to parents level
// by level, deepest first (`inner`: the levels below the top one, concatenated; `bounds`: where each
// starts, and the end). Each level's children are summed per parent in level order first, then added,
// which is the order numpy's bincount adds them in, so the float sums are the same to the bit.
py::array_t<double> inclusive(const py::array_t<double, py::array::c_style | py::array::forcecast>& own_in,
                              const Int64Array& parent_in, const Int64Array& inner_in,
                              const Int64Array& bounds_in) {
  const auto own = own_in.unchecked<1>();
  const auto parent = parent_in.unchecked<1>();
  const auto inner = inner_in.unchecked<1>();
  const auto bounds = bounds_in.unchecked<1>();
  const py::ssize_t count = own.shape(0);
  if (parent.shape(0) != count) throw std::invalid_argument("inclusive: columns of different lengths");
  py::array_t<double> total_out(count);
  auto total = total_out.mutable_unchecked<1>();
  for (py::ssize_t i = 0; i < count; ++i) total(i) = own(i);
  std::vector<double> summed(static_cast<size_t>(count), 0.0);
  std::vector<char> pending(static_cast<size_t>(count), 0);
  for (py::ssize_t level = bounds.shape(0) - 2; level >= 0; --level) {
    const int64_t lo = bounds(level), hi = bounds(level + 1);
    for (int64_t k = lo; k < hi; ++k) {
      const int64_t s = inner(k), p = parent(s);
      if (s < 0 || s >= count || p < 0 || p >= count) throw std::out_of_range("inclusive: bad span");
      summed[static_cast<size_t>(p)] += total(s);
      pending[static_cast<size_t>(p)] = 1;
    }
    for (int64_t k = lo; k < hi; ++k) {
      const auto p = static_cast<size_t>(parent(inner(k)));
      if (pending[p]) {
        total(static_cast<py::ssize_t>(p)) += summed[p];
        summed[p] = 0.0;
        pending[p] = 0;
      }
    }
  }
  return total_out;
}

// a + b as numpy's int64 addition gives it (wrapping, where C++'s signed overflow is undefined)
int64_t wrapped_sum(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}

// sums.innermost_spans: for each query (thread, time), the innermost span of `order` (time order) on
// that thread containing the time: the last span starting at or before it, or the nearest ancestor
// (`parent`) not yet ended then; -1 when none. What the numpy path finds with a search per thread
// and a walk up one level per step, here a binary search and a walk per query.
Int64Array innermost(const Int64Array& order_in, const Int64Array& tid_in, const Int64Array& ts_in,
                     const Int64Array& dur_in, const Int64Array& parent_in, const Int64Array& query_tid_in,
                     const Int64Array& query_ts_in) {
  const auto order = order_in.unchecked<1>();
  const auto tid = tid_in.unchecked<1>();
  const auto ts = ts_in.unchecked<1>();
  const auto dur = dur_in.unchecked<1>();
  const auto parent = parent_in.unchecked<1>();
  const auto query_tid = query_tid_in.unchecked<1>();
  const auto query_ts = query_ts_in.unchecked<1>();
  const py::ssize_t count = ts.shape(0), queries = query_ts.shape(0);
  if (tid.shape(0) != count || dur.shape(0) != count || parent.shape(0) != count ||
      query_tid.shape(0) != queries) {
    throw std::invalid_argument("innermost: columns of different lengths");
  }
  // per thread, its spans' indices and starts in time order
  std::unordered_map<int64_t, std::pair<std::vector<int64_t>, std::vector<int64_t>>> threads;
  for (py::ssize_t k = 0; k < order.shape(0); ++k) {
    const int64_t s = order(k);
    if (s < 0 || s >= count) throw std::out_of_range("innermost: span index out of range");
    auto& thread = threads[tid(s)];
    thread.first.push_back(s);
    thread.second.push_back(ts(s));
  }
  Int64Array owners_out(queries);
  auto owners = owners_out.mutable_unchecked<1>();
  const std::pair<std::vector<int64_t>, std::vector<int64_t>>* thread = nullptr;
  int64_t thread_id = 0;
  for (py::ssize_t q = 0; q < queries; ++q) {
    if (thread == nullptr || query_tid(q) != thread_id) {  // queries mostly come a thread at a time
      thread_id = query_tid(q);
      const auto found = threads.find(thread_id);
      thread = found == threads.end() ? &kNoSpans : &found->second;
    }
    const int64_t t = query_ts(q);
    const auto& starts = thread->second;
    const auto after = std::upper_bound(starts.begin(), starts.end(), t);
    int64_t owner = after == starts.begin() ? -1 : thread->first[static_cast<size_t>(after - starts.begin() - 1)];
    while (owner >= 0 && wrapped_sum(ts(owner), dur(owner)) < t) {
      owner = parent(owner);
      if (owner >= count) throw std::out_of_range("innermost: parent out of range");
    }
    owners(q) = owner;
  }
  return owners_out;
}

// memory/story.py's pairing: for each allocation (bytes > 0), the index of the free of its address
// that comes next among the events at that address (bytes < 0), -1 when the next is no free or
// there is none; frees get -1. Events in time order; one pass with the last event seen per address,
// where numpy sorts by address.
Int64Array pair_frees(const Int64Array& addr_in, const Int64Array& nbytes_in) {
  const auto addr = addr_in.unchecked<1>();
  const auto nbytes = nbytes_in.unchecked<1>();
  const py::ssize_t n = addr.shape(0);
  if (nbytes.shape(0) != n) throw std::invalid_argument("pair_frees: columns of different lengths");
  Int64Array free_at_out(n);
  auto free_at = free_at_out.mutable_unchecked<1>();
  KeyTable last(static_cast<size_t>(n));  // address -> its latest event
  for (py::ssize_t i = 0; i < n; ++i) {
    free_at(i) = -1;
    int64_t& latest = last.at(addr(i));
    if (latest >= 0 && nbytes(latest) > 0 && nbytes(i) < 0) free_at(latest) = i;
    latest = i;
  }
  return free_at_out;
}

// memory/story.py's _last_at_or_before, for rows in time order: for each query (address, time), the
// last row at that address starting at or before the time (its index, 0 where none; whether there is
// one). Each address's rows are chained latest first; a query walks back from the latest past the
// rows that start after it (an address is reused a few times a step).
py::tuple last_at_or_before(const Int64Array& addr_in, const Int64Array& ts_in, const Int64Array& at_addr_in,
                            const Int64Array& at_ts_in) {
  const auto addr = addr_in.unchecked<1>();
  const auto ts = ts_in.unchecked<1>();
  const auto at_addr = at_addr_in.unchecked<1>();
  const auto at_ts = at_ts_in.unchecked<1>();
  const py::ssize_t n = addr.shape(0), queries = at_addr.shape(0);
  if (ts.shape(0) != n || at_ts.shape(0) != queries) {
    throw std::invalid_argument("last_at_or_before: columns of different lengths");
  }
  KeyTable latest(static_cast<size_t>(n));          // address -> its latest row
  std::vector<int64_t> earlier(static_cast<size_t>(n));  // row -> the row before it at its address
  for (py::ssize_t i = 0; i < n; ++i) {
    if (i > 0 && ts(i) < ts(i - 1)) throw std::invalid_argument("last_at_or_before: rows not in time order");
    int64_t& last = latest.at(addr(i));
    earlier[static_cast<size_t>(i)] = last;
    last = i;
  }
  Int64Array hit_out(queries);
  py::array_t<bool> matched_out(queries);
  auto hit = hit_out.mutable_unchecked<1>();
  auto matched = matched_out.mutable_unchecked<1>();
  for (py::ssize_t q = 0; q < queries; ++q) {
    int64_t row = latest.find(at_addr(q));
    while (row >= 0 && ts(row) > at_ts(q)) row = earlier[static_cast<size_t>(row)];
    hit(q) = std::max<int64_t>(row, 0);
    matched(q) = row >= 0;
  }
  return py::make_tuple(hit_out, matched_out);
}

// memory/sums.py's range_max: max(values[lo[k]:hi[k]]) for every k (all ranges non-empty), from a
// sparse table of the levels the longest range needs.
Int64Array range_max(const Int64Array& values_in, const Int64Array& lo_in, const Int64Array& hi_in) {
  const auto values = values_in.unchecked<1>();
  const auto lo = lo_in.unchecked<1>();
  const auto hi = hi_in.unchecked<1>();
  const py::ssize_t n = values.shape(0), queries = lo.shape(0);
  if (hi.shape(0) != queries) throw std::invalid_argument("range_max: columns of different lengths");
  int64_t longest = 0;
  for (py::ssize_t q = 0; q < queries; ++q) {
    if (lo(q) < 0 || hi(q) > n || hi(q) <= lo(q)) throw std::out_of_range("range_max: bad range");
    longest = std::max(longest, hi(q) - lo(q));
  }
  std::vector<std::vector<int64_t>> table;  // level k: max of the 2**k values from each position
  table.emplace_back(values.data(0), values.data(0) + n);
  for (int64_t span = 1; 2 * span <= longest; span *= 2) {
    const auto& prev = table.back();
    std::vector<int64_t> next(prev.size() - static_cast<size_t>(span));
    for (size_t i = 0; i < next.size(); ++i) next[i] = std::max(prev[i], prev[i + static_cast<size_t>(span)]);
    table.push_back(std::move(next));
  }
  Int64Array result_out(queries);
  auto result = result_out.mutable_unchecked<1>();
  for (py::ssize_t q = 0; q < queries; ++q) {
    const int64_t length = hi(q) - lo(q);
    int level = 0;
    while ((int64_t{2} << level) <= length) ++level;
    const auto& rows = table[static_cast<size_t>(level)];
    result(q) = std::max(rows[static_cast<size_t>(lo(q))], rows[static_cast<size_t>(hi(q) - (int64_t{1} << level))]);
  }
  return result_out;
}

}  // namespace

void register_functions(py::module_& m) {
  m.def("nest", &nest, py::arg("order"), py::arg("tid"), py::arg("ts"), py::arg("dur"));
  m.def("group", &group, py::arg("keys"));
  m.def("innermost", &innermost, py::arg("order"), py::arg("tid"), py::arg("ts"), py::arg("dur"),
        py::arg("parent"), py::arg("query_tid"), py::arg("query_ts"));
  m.def("pair_frees", &pair_frees, py::arg("addr"), py::arg("nbytes"));
  m.def("last_at_or_before", &last_at_or_before, py::arg("addr"), py::arg("ts"), py::arg("at_addr"),
        py::arg("at_ts"));
  m.def("range_max", &range_max, py::arg("values"), py::arg("lo"), py::arg("hi"));
  m.def("inclusive", &inclusive, py::arg("own"), py::arg("parent"), py::arg("inner"), py::arg("bounds"));
}

}  // namespace layerscope_nesting
