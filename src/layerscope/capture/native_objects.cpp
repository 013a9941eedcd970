// The live-tensor scan's two passes, in C++ (part of layerscope's native module; see
// capture/live_tensors.py).
//
// The scan looks for the few hundred tensors and optimizers among every object the garbage
// collector tracks (hundreds of thousands in a process that imported torch). gc.get_objects()
// builds a list of them all (a reference taken on each, and dropped again when the list goes: two
// writes to every object's header, most of them out of the caches after a training step); here the
// collector's own lists are walked in place and only the objects of the wanted types are kept: one
// read of each object's header. From the second walk on (3.10-3.11), only the objects tracked or
// moved since the previous walk are visited, where that provably finds the same (Incremental,
// below). Then each tensor's storage: in Python a storage object is made per tensor to read its
// address and size; here they are read off the tensor's storage directly, through the same checks.

#include <pybind11/pybind11.h>
#include <torch/csrc/autograd/python_variable.h>

#include <tuple>
#include <unordered_set>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace layerscope_objects {
namespace {

// The type objects of `types` (a set of types).
std::unordered_set<PyObject*> type_set(const py::set& types) {
  std::unordered_set<PyObject*> wanted;
  for (const py::handle type : types) {
    wanted.insert(type.ptr());
  }
  return wanted;
}

// The items of `objects` (a list) whose exact type is one of `types` (a set of types), in order.
py::list of_types(const py::list& objects, const py::set& types) {
  const std::unordered_set<PyObject*> wanted = type_set(types);
  py::list found;
  PyObject* list = objects.ptr();
  const Py_ssize_t size = PyList_GET_SIZE(list);
  for (Py_ssize_t i = 0; i < size; ++i) {
    PyObject* item = PyList_GET_ITEM(list, i);
    if (wanted.count(reinterpret_cast<PyObject*>(Py_TYPE(item))) != 0) {
      found.append(py::reinterpret_borrow<py::object>(item));
    }
  }
  return found;
}

// Every object the collector tracks whose exact type is one of `types`, as gc.get_objects() would
// list them, or None where this Python's lists cannot be walked from here; `incremental`: visit only
// what may have changed since the previous walk where that is provably enough (3.10-3.11, below).
// Nothing runs Python code during a walk and nothing it makes is tracked, so the lists hold still.

#if PY_VERSION_HEX >= 0x030C0000
// Python 3.12 on: the interpreter walks its lists for us (PyUnstable_GC_VisitObjects); always the
// whole walk (the incremental one below relies on 3.10-3.11's list operations).
int visit_object(PyObject* object, void* arg) {
  auto* state = static_cast<std::pair<const std::unordered_set<PyObject*>*, py::list*>*>(arg);
  if (state->first->count(reinterpret_cast<PyObject*>(Py_TYPE(object))) != 0 &&
      object != state->second->ptr()) {
    // a reference taken, no object made: the lists stay as they are; never throws (a C++
    // exception must not unwind through the interpreter's walk): a failure is raised after it
    if (PyList_Append(state->second->ptr(), object) != 0) {
      return 0;  // stop
    }
  }
  return 1;  // go on
}

Py_ssize_t last_visited = 0;

py::object tracked_of_types(const py::set& types, bool /*incremental*/) {
  const std::unordered_set<PyObject*> wanted = type_set(types);
  py::list found;  // made first: a collection it triggered could free what the walk saw
  std::pair<const std::unordered_set<PyObject*>*, py::list*> state{&wanted, &found};
  PyUnstable_GC_VisitObjects(&visit_object, &state);
  if (PyErr_Occurred() != nullptr) {
    throw py::error_already_set();
  }
  last_visited = -1;  // not counted
  return std::move(found);
}

py::tuple walk_stats() { return py::make_tuple(false, last_visited); }

#elif PY_VERSION_HEX >= 0x030A0000
// Python 3.10 and 3.11 have no public walk: their collector's layout (Include/internal/pycore_gc.h)
// is mirrored here. Each tracked object is preceded by a GC header; the headers of a generation form
// a ring through `next` around the generation's own header; the three generations lie side by side
// in the collector's state, followed by its pointer to generation 0's header.
struct GCHead {
  uintptr_t next;
  uintptr_t prev;  // low bits are flags (_PyGC_PREV_MASK_FINALIZED, _PyGC_PREV_MASK_COLLECTING)
};
struct GCGeneration {
  GCHead head;
  int threshold;
  int count;
};
constexpr int kGenerations = 3;
constexpr uintptr_t kPrevFlags = 3;

GCHead* head_of(PyObject* object) { return reinterpret_cast<GCHead*>(object) - 1; }
PyObject* object_of(GCHead* head) { return reinterpret_cast<PyObject*>(head + 1); }
GCHead* next_of(const GCHead* node) { return reinterpret_cast<GCHead*>(node->next); }
GCHead* prev_of(const GCHead* node) { return reinterpret_cast<GCHead*>(node->prev & ~kPrevFlags); }
void set_prev(GCHead* node, GCHead* prev) {
  node->prev = (node->prev & kPrevFlags) | reinterpret_cast<uintptr_t>(prev);
}

// Moves `node` (one of our own sentinels) from wherever it is to the head (`tail` false) or the
// tail of `list`, as the collector's gc_list_move does: the flags of its `prev` are kept.
void move_to(GCHead* node, GCHead* list, bool tail) {
  GCHead* prev = prev_of(node);
  GCHead* next = next_of(node);
  prev->next = reinterpret_cast<uintptr_t>(next);
  set_prev(next, prev);
  GCHead* at = tail ? prev_of(list) : list;  // the node it goes after, found once it is unlinked
  GCHead* after = next_of(at);
  node->next = reinterpret_cast<uintptr_t>(after);
  set_prev(node, at);
  at->next = reinterpret_cast<uintptr_t>(node);
  set_prev(after, node);
}

// The collector's generations, found from a fresh list (the collector links each object it starts
// tracking at the end of generation 0, so the list's next header is generation 0's own), or null
// where the layout is not the one mirrored here: the pointer after the generations must be
// generation 0's header and each generation's threshold the one gc.get_threshold() reports.
GCGeneration* generations() {
  PyObject* probe = PyList_New(0);
  if (probe == nullptr) {
    throw py::error_already_set();
  }
  auto* head0 = reinterpret_cast<GCGeneration*>(head_of(probe)->next);
  Py_DECREF(probe);
  const auto thresholds = py::module_::import("gc").attr("get_threshold")().cast<py::tuple>();
  if (head0 == nullptr || thresholds.size() != kGenerations ||
      *reinterpret_cast<GCHead**>(head0 + kGenerations) != &head0->head) {
    return nullptr;
  }
  for (int g = 0; g < kGenerations; ++g) {
    if (head0[g].threshold != thresholds[g].cast<int>()) {
      return nullptr;
    }
  }
  return head0;
}

// The incremental walk. Between two walks the collector changes its lists only by these operations
// (Modules/gcmodule.c, 3.10-3.11): it links each object it starts tracking at generation 0's tail;
// a collection of generation g appends generations 0..g-1 to g's tail (in that order), moves an
// object its pass finds reachable late to the tail of g, and appends the survivors (and anything
// resurrected or left uncollectable) to the tail of g+1 (g itself for the oldest); untracking and
// freeing unlink. gc.freeze() appends generations 0, 1, 2 to the permanent generation's tail;
// gc.unfreeze() appends that to generation 2's tail. So with two sentinels of ours (empty lists we
// hold, so their reference count never drops to what the collector sees inside a generation: they
// are never moved, never freed) put at the head and the tail of generation 2 at the end of a walk,
// as long as no freeze happened since, every object tracked since that walk, and every one moved
// by a collection, lies after the tail sentinel in generation 2 or in generations 1 and 0: nothing
// is ever linked before an object of generation 2, and only the oldest generation's collection
// reorders generations (0 before 1: it cannot put anything before the tail sentinel, which is in
// generation 2 already). A freeze is seen in gc.get_freeze_count() while it lasts; after an
// unfreeze the head sentinel is generation 2's first object again only if generations 0 and 1 were
// empty when it froze and nothing was frozen before nor reached generation 2 meanwhile: then
// generation 2 is as the freeze found it. Otherwise the whole walk runs. The tensors found at the
// previous walk are kept as weak references: those still alive, tracked and of a wanted type are
// found again without visiting the objects before the tail sentinel.
struct Incremental {
  PyObject* head = nullptr;  // the sentinel at generation 2's head (a strong reference)
  PyObject* tail = nullptr;  // the sentinel at generation 2's tail (a strong reference)
  bool valid = false;        // the sentinels and `seen` describe the previous walk
  std::vector<PyObject*> seen;   // weak references to what the previous walk found
  std::vector<PyObject*> types;  // the types it looked for (strong references)
  bool last_incremental = false;
  Py_ssize_t last_visited = 0;
};

Incremental& incremental_state() {
  static auto* state = new Incremental();  // never destroyed: it holds Python objects
  return *state;
}

bool same_types(const std::vector<PyObject*>& had, const std::unordered_set<PyObject*>& wanted) {
  if (had.size() != wanted.size()) {
    return false;
  }
  for (PyObject* type : had) {
    if (wanted.count(type) == 0) {
      return false;
    }
  }
  return true;
}

// Objects after the tail sentinel to generation 2's end, then generations 1 and 0; false (having
// visited an unknown part) where the tail sentinel turns out not to be in generation 2.
template <typename Visit>
bool walk_since(GCGeneration* gens, Incremental& state, Visit& visit) {
  for (GCHead* node = next_of(head_of(state.tail)); node != &gens[2].head; node = next_of(node)) {
    if (node == &gens[0].head || node == &gens[1].head) {
      return false;
    }
    visit(object_of(node));
  }
  for (int g = 1; g >= 0; --g) {
    for (GCHead* node = next_of(&gens[g].head); node != &gens[g].head; node = next_of(node)) {
      visit(object_of(node));
    }
  }
  return true;
}

template <typename Visit>
void walk_all(GCGeneration* gens, Visit& visit) {
  for (int g = 0; g < kGenerations; ++g) {
    for (GCHead* node = next_of(&gens[g].head); node != &gens[g].head; node = next_of(node)) {
      visit(object_of(node));
    }
  }
}

// The previous walk's findings still alive, still tracked (a frozen or untracked object is not in
// a generation) and of a wanted type, appended to `found` unless already in it.
void add_still_alive(const Incremental& state, const std::unordered_set<PyObject*>& wanted, py::list& found) {
  std::unordered_set<PyObject*> have;
  for (const py::handle item : found) {
    have.insert(item.ptr());
  }
  for (PyObject* ref : state.seen) {
    PyObject* object = PyWeakref_GET_OBJECT(ref);
    if (object == Py_None || have.count(object) != 0 || PyObject_GC_IsTracked(object) == 0 ||
        wanted.count(reinterpret_cast<PyObject*>(Py_TYPE(object))) == 0) {
      continue;
    }
    if (PyList_Append(found.ptr(), object) != 0) {
      throw py::error_already_set();
    }
    have.insert(object);
  }
}

// What this walk found becomes the next one's `seen`, the sentinels go to generation 2's head and
// tail (not while objects are frozen: ours may be among them, and moving them would change
// gc.get_freeze_count()); valid only if all of it succeeded.
void remember(Incremental& state, GCGeneration* gens, const std::unordered_set<PyObject*>& wanted,
              const py::list& found, bool frozen) {
  std::vector<PyObject*> had;
  had.swap(state.seen);
  for (PyObject* type : state.types) {
    Py_DECREF(type);
  }
  state.types.assign(wanted.begin(), wanted.end());
  for (PyObject* type : state.types) {
    Py_INCREF(type);
  }
  bool complete = !frozen;
  if (complete) {
    move_to(head_of(state.head), &gens[2].head, false);
    move_to(head_of(state.tail), &gens[2].head, true);
    // weak references are tracked objects: made after the sentinels are placed, they are new to
    // the next walk (generation 0), and no object the walk did not see can come before the tail.
    // Made before the previous ones are dropped: an object found again gets the same one back
    // (no allocation, so the collector's counts move only by what is new).
    state.seen.reserve(PyList_GET_SIZE(found.ptr()));
    for (const py::handle item : found) {
      PyObject* ref = PyWeakref_NewRef(item.ptr(), nullptr);
      if (ref == nullptr) {  // a type without weak references: the next walk is a whole one
        PyErr_Clear();
        complete = false;
        break;
      }
      state.seen.push_back(ref);
    }
  }
  for (PyObject* ref : had) {
    Py_DECREF(ref);
  }
  state.valid = complete;
}

// Whether the permanent generation (gc.freeze()'s, after the pointer to generation 0's header) is
// empty: read in place first, as gc.get_freeze_count() counts its objects one by one (a process that
// froze its heap before forking has all of them there); that count confirms it at no cost.
bool nothing_frozen(GCGeneration* gens) {
  const auto* permanent = reinterpret_cast<const GCGeneration*>(
      reinterpret_cast<const char*>(gens + kGenerations) + sizeof(GCHead*));
  const bool empty = permanent->threshold == 0 && permanent->count == 0 &&
                     next_of(&permanent->head) == &permanent->head && prev_of(&permanent->head) == &permanent->head;
  return empty && py::module_::import("gc").attr("get_freeze_count")().cast<Py_ssize_t>() == 0;
}

py::object tracked_of_types(const py::set& types, bool incremental) {
  const std::unordered_set<PyObject*> wanted = type_set(types);
  GCGeneration* gens = generations();
  if (gens == nullptr) {
    return py::none();
  }
  const bool frozen = !nothing_frozen(gens);
  Incremental& state = incremental_state();
  if (state.head == nullptr) {
    state.head = PyList_New(0);
    state.tail = PyList_New(0);
    if (state.head == nullptr || state.tail == nullptr) {
      throw py::error_already_set();
    }
  }
  py::list found;  // made first: a collection it triggered could free what the walk saw
  bool failed = false;
  Py_ssize_t visited = 0;
  auto keep = [&](PyObject* object) {
    ++visited;
    const bool wanted_type = wanted.count(reinterpret_cast<PyObject*>(Py_TYPE(object))) != 0;
    if (failed || !wanted_type || object == found.ptr() || object == state.head || object == state.tail) {
      return;
    }
    // a reference taken, no object made: the lists stay as they are
    failed = PyList_Append(found.ptr(), object) != 0;
  };
  bool since = incremental && state.valid && !frozen && same_types(state.types, wanted) &&
               next_of(&gens[2].head) == head_of(state.head);
  state.valid = false;
  if (since && !walk_since(gens, state, keep)) {
    since = false;
    visited = 0;
    if (PyList_SetSlice(found.ptr(), 0, PyList_GET_SIZE(found.ptr()), nullptr) != 0) {
      throw py::error_already_set();
    }
  }
  if (!since) {
    walk_all(gens, keep);
  }
  if (failed) {
    throw py::error_already_set();
  }
  if (since) {
    add_still_alive(state, wanted, found);
  }
  state.last_incremental = since;
  state.last_visited = visited;
  remember(state, gens, wanted, found, frozen);
  return std::move(found);
}

// (whether the last walk was incremental, how many objects it visited): for tests and benchmarks.
py::tuple walk_stats() {
  const Incremental& state = incremental_state();
  return py::make_tuple(state.last_incremental, state.last_visited);
}
#else
py::object tracked_of_types(const py::set&, bool) { return py::none(); }
py::tuple walk_stats() { return py::make_tuple(false, -1); }
#endif

// Per tensor of `tensors`: (address, bytes, on a device) of its storage, or None where it has none
// that holds memory — as live_tensors.storage_entry decides: sparse, storage-less or refusing access
// (wrapper subclasses), meta (FakeTensors: their address is never asked), empty.
py::list storage_spans(const py::list& tensors) {
  py::list spans;
  for (const py::handle item : tensors) {
    PyObject* obj = item.ptr();
    if (!THPVariable_Check(obj)) {
      spans.append(py::none());
      continue;
    }
    try {
      const at::Tensor& tensor = THPVariable_Unpack(obj);
      if (!tensor.defined() || tensor.is_sparse() || !tensor.has_storage()) {
        spans.append(py::none());
        continue;
      }
      const c10::Storage& storage = tensor.storage();  // throws where access should throw
      if (storage.device_type() == c10::DeviceType::Meta) {
        spans.append(py::none());
        continue;
      }
      const auto addr = reinterpret_cast<uintptr_t>(storage.unsafeGetStorageImpl()->data_ptr().get());
      if (addr == 0) {
        spans.append(py::none());
        continue;
      }
      spans.append(py::make_tuple(addr, storage.nbytes(), !tensor.is_cpu()));
    } catch (const c10::Error&) {
      spans.append(py::none());
    }
  }
  return spans;
}

}  // namespace

void register_functions(py::module_& m) {
  m.def("objects_of_types", &of_types, py::arg("objects"), py::arg("types"));
  m.def("tracked_of_types", &tracked_of_types, py::arg("types"), py::arg("incremental") = true);
  m.def("walk_stats", &walk_stats);
  m.def("storage_spans", &storage_spans, py::arg("tensors"));
}

}  // namespace layerscope_objects
