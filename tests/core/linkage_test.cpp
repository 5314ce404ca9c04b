// How push's programs are linked: the C++ standard library's functions come from the
// standard library, not from LibTorch. The PyTorch wheels' libtorch_cpu.so exports its own
// copies of parts of libstdc++ (std::filesystem, exception_ptr, ...), and a program whose
// link line names LibTorch first binds its calls to them. With the 2.11 wheel (on a GPU
// machine) std::filesystem::remove_all then jumped to address 0 in every test that removed
// a folder; push::push names the standard library first.
#include <dlfcn.h>

#include <gtest/gtest.h>

#include <string>

namespace push {
namespace {

// The object that serves `symbol` to this program: the first in the global lookup order
// that defines it, as the dynamic linker binds calls (dlsym, so PIE or not).
std::string library_of(const char* symbol) {
  void* address = dlsym(RTLD_DEFAULT, symbol);
  Dl_info info{};
  if (address == nullptr || dladdr(address, &info) == 0 || info.dli_fname == nullptr) return "(not found)";
  return info.dli_fname;
}

TEST(Linkage, StdFilesystemComesFromTheStandardLibraryNotLibTorch) {
  // std::filesystem::remove_all(path const&) and create_directories(path const&, error_code&).
  for (const char* symbol : {"_ZNSt10filesystem10remove_allERKNS_7__cxx114pathE",
                             "_ZNSt10filesystem18create_directoriesERKNS_7__cxx114pathERSt10error_code"}) {
    const auto lib = library_of(symbol);
    EXPECT_NE(lib.find("libstdc++"), std::string::npos) << symbol << " bound to " << lib;
  }
}

}  // namespace
}  // namespace push
