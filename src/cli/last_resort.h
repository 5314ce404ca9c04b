#pragma once
// The last resort of push train when an exception escapes where none may (a destructor,
// a lane thread): one line instead of abort() and a backtrace, and no staging folder left.
//
//   install_last_resort("push train");
//   { Activity a("cannot save the checkpoint to 'ck'");  infer.save(...); }
//
// LibTorch 1.13's archive writer throws from ~PyTorchStreamWriter when a write failed
// (a full disk): inside a lane's save job that reaches std::terminate. The handler prints
// "push train: <activity>: <system error> (<exception>)", removes every unpublished
// StagedFolder and exits with status 1.
#include <string>

namespace push::cli {

void install_last_resort(const char* tool);

/// What the tool is doing meanwhile, for the last-resort line.
class Activity {
 public:
  explicit Activity(const std::string& what);
  ~Activity();
  Activity(const Activity&) = delete;
  Activity& operator=(const Activity&) = delete;
};

}  // namespace push::cli
