#pragma once
// A holder's deleter for push objects whose destruction waits for other threads (lanes,
// peers): it releases the GIL first, since those threads may need it meanwhile (a lane to
// free a tensor that came from Python) and other Python threads should run on.
#include <pybind11/pybind11.h>

#include <memory>

namespace push::python {

struct DeleteWithoutGil {
  template <class T>
  void operator()(T* object) const {
    pybind11::gil_scoped_release unlocked;
    delete object;
  }
};

template <class T>
using WithoutGil = std::unique_ptr<T, DeleteWithoutGil>;

}  // namespace push::python
