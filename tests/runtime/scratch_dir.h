#pragma once
// A scratch folder for checkpoint tests: $TMPDIR/push-<suite>-<pid>/<name>, emptied, with
// its parent created (so the test process never collides with another run's files).
#include <unistd.h>

#include <filesystem>
#include <string>

namespace push::testing {

inline std::filesystem::path fresh_dir(const std::string& suite, const std::string& name) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("push-" + suite + "-" + std::to_string(::getpid())) / name;
  fs::remove_all(dir);
  fs::create_directories(dir.parent_path());
  return dir;
}

}  // namespace push::testing
