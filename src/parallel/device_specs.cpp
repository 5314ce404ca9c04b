// The devices model placement may use, and their memory budgets, read from this machine
// (machin reads them with psutil and GPUtil when ModelAssigner gets no devices).
#include <push/parallel/assigner.h>

#include <dlfcn.h>
#include <unistd.h>

#include "core/torch_compat.h"

namespace push::parallel {
namespace {

constexpr const char* kOrigin = "push::parallel::ModelAssigner";

#if PUSH_WITH_CUDA
// Free bytes on CUDA device `index`, from the CUDA runtime that LibTorch loaded (looked up
// at run time: push links no CUDA runtime of its own, which could differ from LibTorch's).
// Reading it makes the device's context, as any use of the device does.
int64_t cuda_free_bytes(int index) {
  using MemGetInfo = int (*)(size_t*, size_t*);
  static const auto mem_get_info = reinterpret_cast<MemGetInfo>(::dlsym(RTLD_DEFAULT, "cudaMemGetInfo"));
  PUSH_CHECK(mem_get_info != nullptr, kOrigin, "the CUDA runtime's cudaMemGetInfo is not loaded in this process");
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(index));
  size_t free = 0, total = 0;
  const int status = mem_get_info(&free, &total);
  PUSH_CHECK(status == 0, kOrigin, "cudaMemGetInfo on cuda:", index, " failed (CUDA error ", status, ")");
  return static_cast<int64_t>(free);
}
#endif

void check_ratio(double max_mem_ratio) {
  PUSH_CHECK(max_mem_ratio > 0 && max_mem_ratio <= 1, kOrigin, "max_mem_ratio must be in (0, 1], got ", max_mem_ratio);
}

}  // namespace

DeviceSpec cpu_device(double max_mem_ratio, double cpu_weight) {
  check_ratio(max_mem_ratio);
  const double available =
      static_cast<double>(::sysconf(_SC_AVPHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGESIZE));
  return DeviceSpec{c10::kCPU, static_cast<int64_t>(available * max_mem_ratio), cpu_weight};
}

std::vector<DeviceSpec> detect_devices(double max_mem_ratio, double cpu_weight) {
  check_ratio(max_mem_ratio);
  std::vector<DeviceSpec> out;
#if PUSH_WITH_CUDA
  for (int i = 0; i < compat::cuda_device_count(); ++i) {
    const auto budget = static_cast<int64_t>(static_cast<double>(cuda_free_bytes(i)) * max_mem_ratio);
    if (budget > 0) out.push_back(DeviceSpec{c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(i)), budget, 1.0});
  }
#endif
  // Alone, the CPU is all the compute there is (a weight against a GPU's means nothing).
  out.push_back(cpu_device(max_mem_ratio, out.empty() ? 1.0 : cpu_weight));
  return out;
}

}  // namespace push::parallel
