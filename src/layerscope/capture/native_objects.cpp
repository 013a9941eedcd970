// The live-tensor scan's two passes, in C++ (part of layerscope's native module; see
// capture/live_tensors.py).
//
// The scan looks for the few hundred tensors and optimizers among every object the garbage
// collector tracks (hundreds of thousands in a process that imported torch). gc.get_objects()
// builds a list of them all (a reference taken on each, and dropped again when the list goes: two
// writes to every object's header, most of them out of the caches after a training step); here the
// collector's own lists are walked in place and only the objects of the wanted types are kept: one
// read of each object's header. From the second walk on (3.10-3.13), only the objects tracked or
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
// what may have changed since the previous walk where that is provably enough (3.10-3.13, below).
// Nothing runs Python code during a walk and nothing it makes is tracked, so the lists hold still.

// What the last walk did (walk_stats): for tests and benchmarks.
struct WalkStats {
  bool incremental = false;
  Py_ssize_t visited = 0;  // -1: no walk (this Python's lists cannot be walked from here)
  const char* why = "none";  // "incremental", or why the walk was a whole one
};
WalkStats last_walk;

#if PY_VERSION_HEX >= 0x030A0000 && PY_VERSION_HEX < 0x030E0000 && !defined(Py_GIL_DISABLED)
#define LAYERSCOPE_GC_LAYOUT 1
// Python 3.10 to 3.13 (the default build: the free-threaded one has no lists) have no walk that
// leaves the objects untouched: their collector's layout (Include/internal/pycore_gc.h, the same in
// the four; the state inside the interpreter's, `interp->gc`) is mirrored here. Each tracked
// object is preceded by a GC header; the headers of a generation form a ring through `next` around
// the generation's own header; the three generations lie side by side in the collector's state,
// followed by its pointer to generation 0's header and the permanent generation (gc.freeze()'s).
// 3.13 moved the collector to Python/gc.c and shipped 3.12's generational one (its incremental
// collector was reverted before 3.13.0). 3.14's incremental one (a young generation and two old
// spaces) is another layout and needs its own argument: not compiled for it.
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

// The permanent generation: after the pointer to generation 0's header.
GCGeneration* permanent_of(GCGeneration* gens) {
  return reinterpret_cast<GCGeneration*>(reinterpret_cast<char*>(gens + kGenerations) + sizeof(GCHead*));
}

// The collector's generations, found from a fresh list (the collector links each object it starts
// tracking at the end of generation 0, so the list's next header is generation 0's own), or null
// where the layout is not the one mirrored here: the pointer after the generations must be
// generation 0's header, each generation's threshold the one gc.get_threshold() reports, and the
// permanent generation's a ring with no threshold nor count (the collector never sets them).
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
  GCGeneration* permanent = permanent_of(head0);
  GCHead* first = next_of(&permanent->head);
  if (permanent->threshold != 0 || permanent->count != 0 || first == nullptr ||
      prev_of(first) != &permanent->head || next_of(prev_of(&permanent->head)) != &permanent->head) {
    return nullptr;
  }
  return head0;
}

// The incremental walk. Between two walks the collector changes its lists only by these operations
// (Modules/gcmodule.c in 3.10-3.12, Python/gc.c in 3.13: the same): it links each object it starts
// tracking at generation 0's tail; a collection of generation g appends generations 0..g-1 to g's
// tail (in that order), moves an object its pass finds reachable late to the tail of g, and appends
// the survivors (and anything resurrected or left uncollectable) to the tail of g+1 (g itself for
// the oldest); untracking and freeing unlink, and so does 3.12's and 3.13's move of immortal
// objects from the collected generations to the permanent one (update_refs). gc.freeze() appends
// generations 0, 1, 2 to the permanent generation's tail; gc.unfreeze() appends that to generation
// 2's tail. So with two sentinels of ours (empty lists we hold, so their reference count never
// drops to what the collector sees inside a generation: they are never moved, never freed) put at
// the head and the tail of generation 2 at the end of a walk, as long as the head sentinel is still
// generation 2's first object, every object tracked since that walk, and every one moved by a
// collection or brought back by an unfreeze, lies after the tail sentinel in generation 2 or in
// generations 1 and 0: nothing is ever linked before an object of generation 2, and only the oldest
// generation's collection reorders generations (0 before 1: it cannot put anything before the tail
// sentinel, which is in generation 2 already). What was frozen before that walk does not matter
// (CPython 3.12 keeps its immortal tuples there; a server may freeze its heap before forking). A
// freeze since takes the sentinels with generation 2: the head is no longer generation 2's first
// object; after an unfreeze it is again only if generations 0 and 1 were empty when it froze and
// nothing else was frozen nor reached generation 2 meanwhile: then generation 2 is as the freeze
// found it. Otherwise the whole walk runs, and where the sentinels are frozen they stay there,
// since moving them would change gc.get_freeze_count(): two new ones take their place. The tensors
// found at the previous walk are kept as weak references: those still alive, tracked and of a
// wanted type are found again without visiting the objects before the tail sentinel (none of them
// can be frozen: a freeze would have taken the head sentinel too).
struct Incremental {
  PyObject* head = nullptr;  // the sentinel at generation 2's head (a strong reference)
  PyObject* tail = nullptr;  // the sentinel at generation 2's tail (a strong reference)
  std::vector<PyObject*> frozen;  // sentinels a freeze took (kept: freeing them would change its count)
  bool valid = false;        // the sentinels and `seen` describe the previous walk
  std::vector<PyObject*> seen;   // weak references to what the previous walk found
  std::vector<PyObject*> types;  // the types it looked for (strong references)
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
  const GCHead* permanent = &permanent_of(gens)->head;
  for (GCHead* node = next_of(head_of(state.tail)); node != &gens[2].head; node = next_of(node)) {
    if (node == &gens[0].head || node == &gens[1].head || node == permanent) {
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
// a generation; none is frozen here, as said above, and none of the types looked for is immortal)
// and of a wanted type, appended to `found` unless already in it.
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

// What this walk found becomes the next one's `seen`, the sentinels (none of them frozen) go to
// generation 2's head and tail; valid only if all of it succeeded.
void remember(Incremental& state, GCGeneration* gens, const std::unordered_set<PyObject*>& wanted,
              const py::list& found) {
  std::vector<PyObject*> had;
  had.swap(state.seen);
  for (PyObject* type : state.types) {
    Py_DECREF(type);
  }
  state.types.assign(wanted.begin(), wanted.end());
  for (PyObject* type : state.types) {
    Py_INCREF(type);
  }
  bool complete = true;
  move_to(head_of(state.head), &gens[2].head, false);
  move_to(head_of(state.tail), &gens[2].head, true);
  // weak references are tracked objects: made after the sentinels are placed, they are new to the
  // next walk (generation 0), and no object the walk did not see can come before the tail. Made
  // before the previous ones are dropped: an object found again gets the same one back (no
  // allocation, so the collector's counts move only by what is new).
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
  for (PyObject* ref : had) {
    Py_DECREF(ref);
  }
  state.valid = complete;
}

// Whether a freeze holds the head sentinel (it is in generation 2 or in the permanent generation):
// `prev` followed from it to its list's own header, at most kSearch steps (past that, taken as
// held: new sentinels are always correct, and two empty lists are left behind). The permanent
// generation's emptiness alone does not tell: 3.12 moves immortal objects there in collections.
constexpr int kSearch = 1 << 14;

bool held_by_freeze(GCGeneration* gens, const Incremental& state) {
  const GCHead* permanent = &permanent_of(gens)->head;
  if (next_of(permanent) == permanent) {
    return false;
  }
  const GCHead* node = prev_of(head_of(state.head));
  for (int steps = 0; steps < kSearch; ++steps, node = prev_of(node)) {
    if (node == &gens[2].head) {
      return false;
    }
    if (node == permanent) {
      return true;
    }
  }
  return true;
}

// Why the walk cannot visit only what changed since the previous one (null: it can); `head_first`:
// the head sentinel is generation 2's first object, `held`: a freeze holds it.
const char* whole_walk_reason(const Incremental& state, const std::unordered_set<PyObject*>& wanted,
                              bool incremental, bool head_first, bool held) {
  if (!incremental) {
    return "asked";
  }
  if (!state.valid) {  // the first walk
    return "no previous walk";
  }
  if (!same_types(state.types, wanted)) {
    return "new types";
  }
  if (!head_first) {  // a freeze took it; after an unfreeze, objects may lie before it
    return held ? "head frozen" : "head moved";
  }
  return nullptr;
}

// The sentinels, made the first time, and again where a freeze holds the previous ones (kept where
// they are); made before the walk, as making an object can start a collection.
void make_sentinels(Incremental& state) {
  if (state.head != nullptr) {
    state.frozen.push_back(state.head);
    state.frozen.push_back(state.tail);
  }
  state.head = PyList_New(0);
  state.tail = PyList_New(0);
  if (state.head == nullptr || state.tail == nullptr) {
    throw py::error_already_set();
  }
}

py::object layout_walk(const std::unordered_set<PyObject*>& wanted, GCGeneration* gens, bool incremental) {
  Incremental& state = incremental_state();
  const bool made = state.head != nullptr;
  const bool head_first = made && next_of(&gens[2].head) == head_of(state.head);
  const bool held = made && !head_first && held_by_freeze(gens, state);
  if (!made || held) {
    make_sentinels(state);
  }
  const char* why = whole_walk_reason(state, wanted, incremental, head_first, held);
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
  state.valid = false;
  if (why == nullptr && !walk_since(gens, state, keep)) {
    why = "tail outside";
    visited = 0;
    if (PyList_SetSlice(found.ptr(), 0, PyList_GET_SIZE(found.ptr()), nullptr) != 0) {
      throw py::error_already_set();
    }
  }
  if (why != nullptr) {
    walk_all(gens, keep);
  }
  if (failed) {
    throw py::error_already_set();
  }
  if (why == nullptr) {
    add_still_alive(state, wanted, found);
  }
  last_walk = {why == nullptr, visited, why == nullptr ? "incremental" : why};
  remember(state, gens, wanted, found);
  return std::move(found);
}
#endif  // LAYERSCOPE_GC_LAYOUT

#if PY_VERSION_HEX >= 0x030C0000
// Where the layout is not the one mirrored above (3.14 on, the free-threaded build, or a layout
// check that failed), the interpreter walks its lists for us: PyUnstable_GC_VisitObjects, always the
// whole walk (it takes and drops a reference on each object, as gc.get_objects() does).
struct Visit {
  const std::unordered_set<PyObject*>* wanted;
  PyObject* found;
  Py_ssize_t visited = 0;
};

int visit_object(PyObject* object, void* arg) {
  auto* visit = static_cast<Visit*>(arg);
  ++visit->visited;
  if (visit->wanted->count(reinterpret_cast<PyObject*>(Py_TYPE(object))) != 0 && object != visit->found) {
    // a reference taken, no object made: the lists stay as they are; never throws (a C++
    // exception must not unwind through the interpreter's walk): a failure is raised after it
    if (PyList_Append(visit->found, object) != 0) {
      return 0;  // stop
    }
  }
  return 1;  // go on
}

py::object visit_walk(const std::unordered_set<PyObject*>& wanted) {
  py::list found;  // made first: a collection it triggered could free what the walk saw
  Visit visit{&wanted, found.ptr()};
  PyUnstable_GC_VisitObjects(&visit_object, &visit);
  if (PyErr_Occurred() != nullptr) {
    throw py::error_already_set();
  }
  last_walk = {false, visit.visited, "visit"};
  return std::move(found);
}
#endif

// `visit`: the interpreter's walk even where the layout is known (3.12+; None before): for tests
// and benchmarks.
py::object tracked_of_types(const py::set& types, bool incremental, bool visit) {
  const std::unordered_set<PyObject*> wanted = type_set(types);
#ifdef LAYERSCOPE_GC_LAYOUT
  GCGeneration* gens = visit ? nullptr : generations();
  if (gens != nullptr) {
    return layout_walk(wanted, gens, incremental);
  }
#endif
#if PY_VERSION_HEX >= 0x030C0000
  return visit_walk(wanted);
#else
  last_walk = {false, -1, "unwalkable"};
  return py::none();
#endif
}

// (whether the last walk was incremental, how many objects it visited, "incremental" or why it was
// a whole one): for tests and benchmarks.
py::tuple walk_stats() { return py::make_tuple(last_walk.incremental, last_walk.visited, last_walk.why); }

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
  m.def("tracked_of_types", &tracked_of_types, py::arg("types"), py::arg("incremental") = true,
        py::arg("visit") = false);
  m.def("walk_stats", &walk_stats);
  m.def("storage_spans", &storage_spans, py::arg("tensors"));
}

}  // namespace layerscope_objects
