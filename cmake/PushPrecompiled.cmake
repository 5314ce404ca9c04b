# LibTorch's headers dominate build time (a precompiled torch/torch.h takes 60-140 s on one
# core). Each target used to build its own; now two holders build them once per tree and
# every target reuses one: push_pch_torch (torch/torch.h) for the library, the tool, the
# examples and the benchmarks, push_pch_test (torch/torch.h and gtest) for the test binaries.
# The holders compile with the same flags as their users (the sanitizer flags are global),
# so GCC accepts the shared .gch; were it ever refused, -Winvalid-pch would say so and the
# build would still be right, only slower.
add_library(push_pch_torch OBJECT ${PROJECT_SOURCE_DIR}/cmake/pch_holder.cpp)
target_link_libraries(push_pch_torch PRIVATE ${TORCH_LIBRARIES})
target_compile_features(push_pch_torch PRIVATE cxx_std_20)
target_precompile_headers(push_pch_torch PRIVATE <torch/torch.h>)

# push_use_pch(target [TEST]): `target` reuses the shared precompiled LibTorch headers.
function(push_use_pch target)
  cmake_parse_arguments(ARG "TEST" "" "" ${ARGN})
  if(ARG_TEST)
    if(NOT TARGET push_pch_test)
      find_package(GTest REQUIRED)
      add_library(push_pch_test OBJECT ${PROJECT_SOURCE_DIR}/cmake/pch_holder.cpp)
      target_link_libraries(push_pch_test PRIVATE ${TORCH_LIBRARIES} GTest::gtest)
      target_compile_features(push_pch_test PRIVATE cxx_std_20)
      target_precompile_headers(push_pch_test PRIVATE <torch/torch.h> <gtest/gtest.h>)
    endif()
    target_precompile_headers(${target} REUSE_FROM push_pch_test)
  else()
    target_precompile_headers(${target} REUSE_FROM push_pch_torch)
  endif()
  target_compile_options(${target} PRIVATE -Winvalid-pch)
endfunction()
