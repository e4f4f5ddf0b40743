# Writes MT_STAMP_OUT, a header with the source tree's commit and the build date, for `megatrain
# --version`. Run at every build (cmake -P), it rewrites the header only when a value changed, so
# an unchanged tree recompiles nothing. The commit is `git describe --always --dirty` where
# MT_STAMP_SOURCE has its own .git (a file in a worktree, a directory in a clone); "unknown"
# otherwise: a tarball, or a tree unpacked inside some other repository, or no git installed.
# The date is UTC and honours SOURCE_DATE_EPOCH (reproducible builds).
if(NOT MT_STAMP_SOURCE OR NOT MT_STAMP_OUT)
  message(FATAL_ERROR "usage: cmake -DMT_STAMP_SOURCE=DIR -DMT_STAMP_OUT=FILE -P build_stamp.cmake")
endif()
set(commit "unknown")
if(EXISTS "${MT_STAMP_SOURCE}/.git")
  find_program(MT_GIT git)
  if(MT_GIT)
    execute_process(COMMAND ${MT_GIT} describe --always --dirty
                    WORKING_DIRECTORY "${MT_STAMP_SOURCE}"
                    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(rc EQUAL 0 AND out MATCHES "^[A-Za-z0-9._/+-]+$")
      set(commit "${out}")
    endif()
  endif()
endif()
string(TIMESTAMP date "%Y-%m-%d" UTC)
string(CONCAT text "/* Generated at build time by cmake/build_stamp.cmake. */\n"
       "#define MT_BUILD_COMMIT \"${commit}\"\n"
       "#define MT_BUILD_DATE \"${date}\"\n")
set(old "")
if(EXISTS "${MT_STAMP_OUT}")
  file(READ "${MT_STAMP_OUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${MT_STAMP_OUT}" "${text}")
endif()
