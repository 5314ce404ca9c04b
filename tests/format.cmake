# Every C++ file of the tree follows .clang-format, checked by the test command so that a
# change that is not formatted fails here, naming its files. The style is pinned to Debian
# bookworm's clang-format 14: another version formats some constructs differently.
#   cmake -DROOT=<source dir> -P format.cmake        (fix: clang-format -i <the files named>)
cmake_minimum_required(VERSION 3.25)
find_program(CLANG_FORMAT NAMES clang-format-14 clang-format)
if(NOT CLANG_FORMAT)
  message(FATAL_ERROR "clang-format is not installed (apt-get install clang-format; ./scripts/setup does)")
endif()
execute_process(COMMAND ${CLANG_FORMAT} --version OUTPUT_VARIABLE version)
if(NOT version MATCHES "version 14\\.")
  string(STRIP "${version}" version)
  message(FATAL_ERROR "the style is checked with clang-format 14 (Debian bookworm's); found: ${version}")
endif()
file(GLOB_RECURSE files
  ${ROOT}/src/*.cpp ${ROOT}/src/*.h ${ROOT}/include/*.h
  ${ROOT}/tests/*.cpp ${ROOT}/tests/*.h ${ROOT}/bench/*.cpp ${ROOT}/bench/*.h ${ROOT}/examples/*.cpp
  ${ROOT}/python/src/*.cpp ${ROOT}/python/src/*.h)
execute_process(COMMAND ${CLANG_FORMAT} --dry-run --Werror ${files}
                RESULT_VARIABLE rc ERROR_VARIABLE errors OUTPUT_QUIET)
if(NOT rc EQUAL 0)
  string(REGEX MATCHALL "[^\n]*: error: code should be clang-formatted" lines "${errors}")
  set(bad "")
  foreach(line IN LISTS lines)
    string(REGEX REPLACE ":[0-9]+:[0-9]+: error: .*" "" file "${line}")
    file(RELATIVE_PATH file ${ROOT} ${file})
    list(APPEND bad ${file})
  endforeach()
  list(REMOVE_DUPLICATES bad)
  list(JOIN bad "\n  " bad)
  message(FATAL_ERROR "not formatted as .clang-format says (clang-format -i each):\n  ${bad}")
endif()
list(LENGTH files count)
message(STATUS "format: ${count} files follow .clang-format")
