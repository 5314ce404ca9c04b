# The layering docs/architecture.md promises: a layer includes only itself and the layers
# below it, never one above (which would make the two depend on each other).
#   core (+ include/push/detail, LibTorch compatibility)  <  dist  <  runtime, server, parallel
# Run as: cmake -DROOT=<source dir> -P layers.cmake
cmake_minimum_required(VERSION 3.25)
set(below_detail "")
set(below_core detail)
set(below_dist detail core)
set(below_runtime detail core dist)
set(below_server detail core dist)
set(below_parallel detail core dist)
set(layers detail core dist runtime server parallel)
# The areas a file could name: every folder of src/ and include/push/.
file(GLOB areas LIST_DIRECTORIES true RELATIVE ${ROOT}/src ${ROOT}/src/*)
file(GLOB public LIST_DIRECTORIES true RELATIVE ${ROOT}/include/push ${ROOT}/include/push/*)
list(APPEND areas ${public})
list(REMOVE_DUPLICATES areas)

set(violations "")
foreach(layer IN LISTS layers)
  set(allowed ${layer} ${below_${layer}})
  file(GLOB_RECURSE files ${ROOT}/src/${layer}/*.h ${ROOT}/src/${layer}/*.cpp
                          ${ROOT}/include/push/${layer}/*.h)
  foreach(file IN LISTS files)
    file(STRINGS ${file} includes REGEX "^#include [<\"](push/)?[a-z_]+/")
    foreach(line IN LISTS includes)
      string(REGEX MATCH "^#include [<\"](push/)?([a-z_]+)/" _ "${line}")
      set(area ${CMAKE_MATCH_2})
      if(area IN_LIST areas AND NOT area IN_LIST allowed)
        file(RELATIVE_PATH name ${ROOT} ${file})
        string(APPEND violations "  ${name}: ${line} (${layer} may include only: ${allowed})\n")
      endif()
    endforeach()
  endforeach()
endforeach()
if(violations)
  message(FATAL_ERROR "a layer includes one above it:\n${violations}")
endif()
message(STATUS "layers: ${layers}, each including only itself and those below")
