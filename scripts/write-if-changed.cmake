# write-if-changed.cmake - drama_write_if_changed(PATH TEXT): writes TEXT to PATH only when the
# file's text differs, so what depends on PATH rebuilds only on a real change (include() it from
# a -P script: git-commit.cmake, embed-files.cmake).
function(drama_write_if_changed path text)
  set(old "")
  if(EXISTS ${path})
    file(READ ${path} old)
  endif()
  if(NOT old STREQUAL text)
    file(WRITE ${path} "${text}")
  endif()
endfunction()
