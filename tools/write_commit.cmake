# Writes OUTPUT (a header defining FUSEBOX_COMMIT) from `git describe` of SOURCE_DIR: the short
# hash, "-dirty" when the tree has changes; "unknown" where git or the repository is missing.
# The file is rewritten only when the text changes (file(CONFIGURE)), so builds at the same
# commit recompile nothing.
cmake_minimum_required(VERSION 3.25)  # a script run with -P: the project's policies
set(commit "unknown")
find_package(Git QUIET)
if(GIT_FOUND)
  execute_process(COMMAND ${GIT_EXECUTABLE} -C ${SOURCE_DIR} describe --always --dirty --abbrev=7
                  OUTPUT_VARIABLE described RESULT_VARIABLE status ERROR_QUIET
                  OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(status EQUAL 0 AND NOT described STREQUAL "")
    set(commit "${described}")
  endif()
endif()
file(CONFIGURE OUTPUT ${OUTPUT} CONTENT "#pragma once\n#define FUSEBOX_COMMIT \"@commit@\"\n" @ONLY)
