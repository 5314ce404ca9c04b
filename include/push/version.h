#pragma once
// push's version: the one place it is written. CMakeLists.txt (project VERSION) and the
// Python package (python/pyproject.toml, through scikit-build-core's regex provider) read
// these three lines.
#define PUSH_VERSION_MAJOR 0
#define PUSH_VERSION_MINOR 1
#define PUSH_VERSION_PATCH 0

#define PUSH_VERSION_STRINGIFY_(x) #x
#define PUSH_VERSION_STRINGIFY(x) PUSH_VERSION_STRINGIFY_(x)
/// "MAJOR.MINOR.PATCH".
#define PUSH_VERSION_STRING                  \
  PUSH_VERSION_STRINGIFY(PUSH_VERSION_MAJOR) \
  "." PUSH_VERSION_STRINGIFY(PUSH_VERSION_MINOR) "." PUSH_VERSION_STRINGIFY(PUSH_VERSION_PATCH)
