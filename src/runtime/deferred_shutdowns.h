#pragma once
// Shutdowns that cannot run on the calling thread: a push::Push destroyed from one of its
// own handlers cannot join the lane it runs on, so a thread of its own shuts it down once
// that handler returns or waits. Those threads are joined when the next one starts (the
// finished ones) and, at the latest, at exit: none is detached, none outlives the
// process's static destructors.
#include <memory>

namespace push::detail {

class Runtime;

/// Shuts `runtime` down and frees it on a thread named "push-shutdown".
void shut_down_later(std::shared_ptr<Runtime> runtime);

}  // namespace push::detail
