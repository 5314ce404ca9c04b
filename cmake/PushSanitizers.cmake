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
