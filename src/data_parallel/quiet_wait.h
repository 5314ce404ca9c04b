#pragma once
// Waiting for a collective before its buffers go or are reused, whatever became of it:
// a destructor, or a step dropping what a failed one left in flight, has nobody to tell.
#include <push/dist/collective.h>

namespace push::data_parallel::detail {

inline void wait_quietly(const dist::Work& work) {
  try {
    work.wait();
  } catch (const std::exception&) {
  }
}

}  // namespace push::data_parallel::detail
