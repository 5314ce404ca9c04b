# Sanitizers instrument push's own code only: LibTorch comes from Debian and is not
# instrumented, so what it does internally is covered by the suppression files in
# tools/sanitizers/ (each entry names a library function, never ours; see tsan.supp).
if(PUSH_SANITIZER STREQUAL "address")
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize=vptr)
  add_link_options(-fsanitize=address,undefined -fno-sanitize=vptr)
elseif(PUSH_SANITIZER STREQUAL "thread")
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)
elseif(NOT PUSH_SANITIZER STREQUAL "")
  message(FATAL_ERROR "PUSH_SANITIZER must be '', 'address' or 'thread', got '${PUSH_SANITIZER}'")
endif()

# What every test runs with (the C++ tests, and the Python tests in an ASan build): the
# suppression files and the options the fibers' stack switches need.
set(PUSH_SANITIZER_ENVIRONMENT
  "TSAN_OPTIONS=suppressions=${PROJECT_SOURCE_DIR}/tools/sanitizers/tsan.supp halt_on_error=1 second_deadlock_stack=1"
  "ASAN_OPTIONS=detect_leaks=0:detect_stack_use_after_return=0"
  "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:suppressions=${PROJECT_SOURCE_DIR}/tools/sanitizers/ubsan.supp")
