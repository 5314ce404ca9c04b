#pragma once
// The state behind a Work handle (push/dist/collective.h), and the one way to make one.
#include "dist/c10d.h"

#include <exception>
#include <functional>
#include <mutex>
#include <string>

namespace push::dist {

struct Work::State {
  c10::intrusive_ptr<c10d::Work> work;
  std::string origin;
  Milliseconds timeout{0};
  std::function<void()> on_success;  // runs once, after the data arrived
  std::function<int(int)> source;    // group rank of the sender -> global rank
  int fixed_source = -1;
  std::mutex mutex;
  bool finished = false;
  std::exception_ptr error;
  int source_rank = -1;
};

namespace detail {

// Work's state is private: this one function builds handles for the groups.
struct WorkFactory {
  static Work make(c10::intrusive_ptr<c10d::Work> work, std::string origin, Milliseconds timeout,
                   std::function<void()> on_success = nullptr, int fixed_source = -1,
                   std::function<int(int)> source = nullptr) {
    Work w;
    w.state_ = std::make_shared<Work::State>();
    w.state_->work = std::move(work);
    w.state_->origin = std::move(origin);
    w.state_->timeout = timeout;
    w.state_->on_success = std::move(on_success);
    w.state_->fixed_source = fixed_source;
    w.state_->source = std::move(source);
    return w;
  }
};

}  // namespace detail

}  // namespace push::dist
