// How push's programs are linked: the C++ standard library's functions come from the
// standard library, not from LibTorch. The PyTorch wheels' libtorch_cpu.so exports its own
// copies of parts of libstdc++ (std::filesystem, exception_ptr, ...), and a program whose
// link line names LibTorch first binds its calls to them. With the 2.11 wheel (on a GPU
// machine) std::filesystem::remove_all then jumped to address 0 in every test that removed
// a folder; push::push names the standard library first.
#include <dlfcn.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <system_error>

namespace push {
namespace {

std::string library_of(void* fn) {
  Dl_info info{};
  if (dladdr(fn, &info) == 0 || info.dli_fname == nullptr) return "(unknown)";
  return info.dli_fname;
}

TEST(Linkage, StdFilesystemComesFromTheStandardLibraryNotLibTorch) {
  namespace fs = std::filesystem;
  using RemoveAll = std::uintmax_t (*)(const fs::path&);
  using CreateDirectories = bool (*)(const fs::path&, std::error_code&);
  const RemoveAll remove_all = &fs::remove_all;
  const CreateDirectories create_directories = &fs::create_directories;
  for (const auto& lib :
       {library_of(reinterpret_cast<void*>(remove_all)), library_of(reinterpret_cast<void*>(create_directories))}) {
    EXPECT_NE(lib.find("libstdc++"), std::string::npos) << "std::filesystem bound to " << lib;
  }
}

}  // namespace
}  // namespace push
