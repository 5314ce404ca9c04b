#pragma once
// The C library's heap, tuned for training (see heap.cpp).

namespace push::detail {

/// Once per process: keeps freed tensor memory in the heap instead of handing it back to
/// the system, unless the user tuned malloc through the environment. Idempotent.
void keep_freed_memory();

}  // namespace push::detail
