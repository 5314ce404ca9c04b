# The layer map of docs/architecture.md, enforced on every #include of src/ and include/:
#
#   cli                                          the push tool: may use every area
#    |
#   bayes                                        Bayesian algorithms as particle programs
#    |       \
#   runtime   data_parallel   server             particles; replicas over ranks; services on ranks
#    |    \___     |     \      |   \
#    |        dist |      parallel  |           processes (c10d, RPC); in-process tools
#    |        /    |     /          |
#   core, data, metrics                          errors, futures, fibers, files, clocks; data sets; metrics
#
# An area includes itself and the areas it may use, never another: the edges below are all
# there is. Each area is src/<area>/ (private) and include/push/<area>/ with its umbrella
# include/push/<area>.h (public); include/push/push.h is everything. Checked, for every file:
#  - every include that names an area, as <push/area/...> or "push/area/...", <push/area.h>,
#    "area/..." (src/), or a relative path (by the folder it lands in; a file of the same
#    folder is the file's own area), names one the file's area may use; <push/push.h> is
#    every area (only cli may include it);
#  - a public header (include/) includes only public headers: <push/...> ones that exist
#    under include/push, never a quoted or relative one (those are src/'s), and nothing of
#    c10d, Gloo or TensorPipe;
#  - every folder of src/ and include/push/ is an area of this map.
# Run as: cmake -DROOT=<source dir> -P layers.cmake
cmake_minimum_required(VERSION 3.25)

set(uses_core "")
set(uses_data core)
set(uses_metrics core)
set(uses_parallel core)
set(uses_dist core)
set(uses_runtime core dist)
set(uses_server core dist parallel)
set(uses_data_parallel core dist parallel)
set(uses_bayes core data dist runtime data_parallel)
set(uses_cli core data metrics parallel dist runtime server data_parallel bayes everything)
set(areas core data metrics parallel dist runtime server data_parallel bayes cli)

set(violations "")
macro(violation file text)
  file(RELATIVE_PATH _name ${ROOT} ${file})
  string(APPEND violations "  ${_name}: ${text}\n")
endmacro()

# Every folder is an area of the map.
file(GLOB folders LIST_DIRECTORIES true RELATIVE ${ROOT}/src ${ROOT}/src/*)
file(GLOB public_folders LIST_DIRECTORIES true RELATIVE ${ROOT}/include/push ${ROOT}/include/push/*)
foreach(folder IN LISTS folders public_folders)
  if(IS_DIRECTORY ${ROOT}/src/${folder} OR IS_DIRECTORY ${ROOT}/include/push/${folder})
    if(NOT folder IN_LIST areas)
      string(APPEND violations "  ${folder}/: a folder that is no area of the layer map (add it to tests/layers.cmake and docs/architecture.md)\n")
    endif()
  endif()
endforeach()

# The area a file at `path` (absolute) belongs to, or "" outside src/ and include/push/.
function(area_of_path path out)
  set(area "")
  if(path MATCHES "^${ROOT}/src/([a-z_]+)/")
    set(area ${CMAKE_MATCH_1})
  elseif(path MATCHES "^${ROOT}/include/push/([a-z_]+)/")
    set(area ${CMAKE_MATCH_1})
  elseif(path MATCHES "^${ROOT}/include/push/([a-z_]+)\\.h$")
    set(area ${CMAKE_MATCH_1})
  endif()
  if(area STREQUAL "push")
    set(area everything)  # push/push.h: every area
  elseif(area STREQUAL "version")
    set(area "")
  endif()
  set(${out} ${area} PARENT_SCOPE)
endfunction()

# The area an include line of a file in `file_dir` names, or "" when it names none of
# push's: <push/...> and "push/..." by their path under include/, "area/..." by src/, and a
# relative one by where it lands.
function(area_of line file_dir out)
  set(area "")
  if(line MATCHES "#[ \t]*include[ \t]*[<\"]push/([^>\"]+)[>\"]")
    area_of_path(${ROOT}/include/push/${CMAKE_MATCH_1} area)
  elseif(line MATCHES "#[ \t]*include[ \t]*\"([^\"]+)\"")
    set(path ${CMAKE_MATCH_1})
    if(path MATCHES "^([a-z_]+)/" AND IS_DIRECTORY ${ROOT}/src/${CMAKE_MATCH_1})
      set(area ${CMAKE_MATCH_1})
    else()
      get_filename_component(resolved ${file_dir}/${path} ABSOLUTE)
      area_of_path(${resolved} area)
    endif()
  endif()
  set(${out} ${area} PARENT_SCOPE)
endfunction()

foreach(area IN LISTS areas)
  set(allowed ${area} ${uses_${area}})
  file(GLOB_RECURSE private ${ROOT}/src/${area}/*.h ${ROOT}/src/${area}/*.cpp)
  file(GLOB_RECURSE public ${ROOT}/include/push/${area}/*.h)
  if(EXISTS ${ROOT}/include/push/${area}.h)
    list(APPEND public ${ROOT}/include/push/${area}.h)
  endif()
  foreach(file IN LISTS private public)
    get_filename_component(dir ${file} DIRECTORY)
    set(is_public FALSE)
    if(file IN_LIST public)
      set(is_public TRUE)
    endif()
    file(STRINGS ${file} includes REGEX "^[ \t]*#[ \t]*include")
    foreach(line IN LISTS includes)
      area_of("${line}" ${dir} used)
      if(used AND NOT used IN_LIST allowed)
        violation(${file} "${line} (${area} may include only: ${allowed})")
      endif()
      if(is_public)
        if(line MATCHES "#[ \t]*include[ \t]*\"")
          violation(${file} "${line} (a public header includes a private one)")
        elseif(line MATCHES "#[ \t]*include[ \t]*<(push/[^>]+)>" AND NOT EXISTS ${ROOT}/include/${CMAKE_MATCH_1})
          violation(${file} "${line} (a public header includes one that is not under include/)")
        elseif(line MATCHES "#[ \t]*include[ \t]*<(torch/csrc/distributed|c10d|gloo|tensorpipe)/")
          violation(${file} "${line} (a public header shows the transport underneath: c10d, Gloo, TensorPipe)")
        endif()
      endif()
    endforeach()
  endforeach()
endforeach()

# Inside dist, its sub-areas (docs/architecture.md): transport/ at the bottom (connections,
# handshake, sealed frames, wire); rendezvous/ (the job's store, joining, the secret) uses
# it; rpc/ and collectives/ use both. The files at src/dist/ itself (the handles and the
# state behind them: c10d.h, world_access.h) use every sub-area, and only transport/ may
# not use them. Every folder of src/dist/ is one of these.
set(dist_subareas transport rendezvous rpc collectives)
set(dist_uses_transport "")
set(dist_uses_rendezvous transport top)
set(dist_uses_rpc transport rendezvous top)
set(dist_uses_collectives transport rendezvous top)
file(GLOB dist_folders LIST_DIRECTORIES true RELATIVE ${ROOT}/src/dist ${ROOT}/src/dist/*)
foreach(folder IN LISTS dist_folders)
  if(IS_DIRECTORY ${ROOT}/src/dist/${folder} AND NOT folder IN_LIST dist_subareas)
    string(APPEND violations "  src/dist/${folder}/: a folder that is no sub-area of dist (add it to tests/layers.cmake and docs/architecture.md)\n")
  endif()
endforeach()
foreach(sub IN LISTS dist_subareas)
  file(GLOB_RECURSE files ${ROOT}/src/dist/${sub}/*.h ${ROOT}/src/dist/${sub}/*.cpp)
  foreach(file IN LISTS files)
    file(STRINGS ${file} includes REGEX "^[ \t]*#[ \t]*include[ \t]*\"dist/")
    foreach(line IN LISTS includes)
      set(used top)
      if(line MATCHES "\"dist/([a-z_]+)/")
        set(used ${CMAKE_MATCH_1})
      endif()
      if(NOT used STREQUAL sub AND NOT used IN_LIST dist_uses_${sub})
        string(REPLACE ";" ", " may "${sub};${dist_uses_${sub}}")
        violation(${file} "${line} (dist/${sub} may include only: ${may})")
      endif()
    endforeach()
  endforeach()
endforeach()

# include/push/push.h is everything: it may include every public header, nothing private.
file(STRINGS ${ROOT}/include/push/push.h includes REGEX "^[ \t]*#[ \t]*include")
foreach(line IN LISTS includes)
  if(line MATCHES "#[ \t]*include[ \t]*\"")
    violation(${ROOT}/include/push/push.h "${line} (a public header includes a private one)")
  endif()
endforeach()

if(violations)
  message(FATAL_ERROR "the layer map is broken:\n${violations}")
endif()
list(LENGTH areas count)
message(STATUS "layers: ${count} areas (${areas}), every include within the map")
