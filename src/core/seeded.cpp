#include "core/seeded.h"

namespace push::detail {

std::mutex& seeded_work_mutex() {
  static std::mutex mutex;
  return mutex;
}

}  // namespace push::detail
