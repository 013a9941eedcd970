// The live-tensor scan's two passes, in C++ (part of layerscope's native module; see
// capture/live_tensors.py).
//
// The scan looks at every object the garbage collector tracks (hundreds of thousands in a process
// that imported torch) to find the few hundred tensors and optimizers among them. In Python the test
// per object (a type lookup in a set) costs about as much as the collector's own list of objects;
// here it is a pointer lookup, with no reference taken on the objects it skips. Then each tensor's
// storage: in Python a storage object is made per tensor to read its address and size; here they
// are read off the tensor's storage directly, through the same checks.

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
  m.def("storage_spans", &storage_spans, py::arg("tensors"));
}

}  // namespace layerscope_objects
