// The live-tensor scan's two passes, in C++ (part of layerscope's native module; see
// capture/live_tensors.py).
//
// The scan looks at every object the garbage collector tracks (hundreds of thousands in a process
// that imported torch) to find the few hundred tensors and optimizers among them. gc.get_objects()
// builds a list of them all (a reference taken on each, and dropped again when the list goes: two
// writes to every object's header, most of them out of the caches after a training step); here the
// collector's own lists are walked in place and only the objects of the wanted types are kept: one
// read of each object's header. Then each tensor's storage: in Python a storage object is made per
// tensor to read its address and size; here they are read off the tensor's storage directly,
// through the same checks.

#include <pybind11/pybind11.h>
#include <torch/csrc/autograd/python_variable.h>

#include <tuple>
#include <unordered_set>

namespace py = pybind11;

namespace layerscope_objects {
namespace {

// The items of `objects` (a list) whose exact type is one of `types` (a set of types), in order.
py::list of_types(const py::list& objects, const py::set& types) {
  std::unordered_set<PyObject*> wanted;
  for (const py::handle type : types) {
    wanted.insert(type.ptr());
  }
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

#if PY_VERSION_HEX >= 0x030C0000
// Python 3.12 on: the interpreter walks its lists for us (PyUnstable_GC_VisitObjects).
template <typename Visit>
int visit_object(PyObject* object, void* arg) {
  (*static_cast<Visit*>(arg))(object);
  return 1;  // go on
}

template <typename Visit>
bool walk_tracked(Visit& visit) {
  PyUnstable_GC_VisitObjects(&visit_object<Visit>, &visit);
  return true;
}
#elif PY_VERSION_HEX >= 0x030A0000
// Python 3.10 and 3.11 have no public walk: their collector's layout (Include/internal/pycore_gc.h)
// is mirrored here. Each tracked object is preceded by a GC header; the headers of a generation form
// a ring through `next` around the generation's own header; the three generations lie side by side
// in the collector's state, followed by its pointer to generation 0's header.
struct GCHead {
  uintptr_t next;
  uintptr_t prev;  // low bits are flags
};
struct GCGeneration {
  GCHead head;
  int threshold;
  int count;
};
constexpr int kGenerations = 3;

// The collector's generations, found from a fresh list (the collector links each object it starts
// tracking at the end of generation 0, so the list's next header is generation 0's own), or null
// where the layout is not the one mirrored here: the pointer after the generations must be
// generation 0's header and each generation's threshold the one gc.get_threshold() reports.
GCGeneration* generations() {
  PyObject* probe = PyList_New(0);
  if (probe == nullptr) {
    throw py::error_already_set();
  }
  auto* head0 = reinterpret_cast<GCGeneration*>(reinterpret_cast<GCHead*>(probe)[-1].next);
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

template <typename Visit>
bool walk_tracked(Visit& visit) {
  GCGeneration* gens = generations();
  if (gens == nullptr) {
    return false;
  }
  for (int g = 0; g < kGenerations; ++g) {
    const GCHead* head = &gens[g].head;
    for (auto* node = reinterpret_cast<const GCHead*>(head->next); node != head;
         node = reinterpret_cast<const GCHead*>(node->next)) {
      visit(reinterpret_cast<PyObject*>(const_cast<GCHead*>(node + 1)));
    }
  }
  return true;
}
#else
template <typename Visit>
bool walk_tracked(Visit&) {
  return false;
}
#endif

// Every object the collector tracks whose exact type is one of `types` (a set of types), as
// gc.get_objects() would list them, or None where this Python's lists cannot be walked from here.
// Nothing runs Python code during the walk and nothing it makes is tracked, so the lists hold still.
py::object tracked_of_types(const py::set& types) {
  std::unordered_set<PyObject*> wanted;
  for (const py::handle type : types) {
    wanted.insert(type.ptr());
  }
  py::list found;  // made first: a collection it triggered could free what the walk saw
  // Never throws: on 3.12+ the walk is the interpreter's, and a C++ exception must not unwind
  // through it (nor leave its collector disabled); a failed append is raised after the walk.
  bool failed = false;
  auto keep = [&](PyObject* object) {
    const bool wanted_type = wanted.count(reinterpret_cast<PyObject*>(Py_TYPE(object))) != 0;
    if (failed || !wanted_type || object == found.ptr()) {
      return;
    }
    // a reference taken, no object made: the lists stay as they are
    failed = PyList_Append(found.ptr(), object) != 0;
  };
  if (!walk_tracked(keep)) {
    return py::none();
  }
  if (failed) {
    throw py::error_already_set();
  }
  return std::move(found);
}

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
  m.def("tracked_of_types", &tracked_of_types, py::arg("types"));
  m.def("storage_spans", &storage_spans, py::arg("tensors"));
}

}  // namespace layerscope_objects
