# git-commit.cmake - writes OUT (a one-line C header) with the commit the tree is built from, at
# build time, so a binary never names a stale commit; "+dirty" when tracked files differ from it.
# The file is replaced only when its text changes (only base/error.c depends on it).
# Usage: cmake -DSRC=<source dir> -DOUT=<header> -P git-commit.cmake
execute_process(COMMAND git rev-parse --short=12 HEAD WORKING_DIRECTORY ${SRC}
                OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT commit)
  set(commit "unknown")
else()
  execute_process(COMMAND git diff --quiet HEAD -- WORKING_DIRECTORY ${SRC} RESULT_VARIABLE dirty ERROR_QUIET)
  if(dirty EQUAL 1)
    string(APPEND commit "+dirty")
  endif()
endif()
set(text "#define DRAMA_GIT_COMMIT \"${commit}\"\n")
include(${CMAKE_CURRENT_LIST_DIR}/write-if-changed.cmake)
drama_write_if_changed(${OUT} "${text}")
