# Installs the built glossa into a scratch prefix, then configures, builds and runs the consumer
# project against it with find_package(glossa CONFIG).
foreach(var GLOSSA_BINARY_DIR CONSUMER_SOURCE_DIR WORK_DIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "${var} is not set")
  endif()
endforeach()

file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/install")

function(run)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGV}\n${out}\n${err}")
  endif()
  set(LAST_OUTPUT "${out}" PARENT_SCOPE)
endfunction()

run("${CMAKE_COMMAND}" --install "${GLOSSA_BINARY_DIR}" --prefix "${prefix}")
if(NOT EXISTS "${prefix}/lib/cmake/glossa/glossaConfig.cmake")
  message(FATAL_ERROR "the install has no lib/cmake/glossa/glossaConfig.cmake")
endif()
set(launcher "")
find_program(CCACHE_PROGRAM ccache)
if(CCACHE_PROGRAM)
  set(launcher "-DCMAKE_CXX_COMPILER_LAUNCHER=${CCACHE_PROGRAM}")
endif()
run("${CMAKE_COMMAND}" -S "${CONSUMER_SOURCE_DIR}" -B "${WORK_DIR}/build"
    "-DCMAKE_PREFIX_PATH=${prefix}" -DCMAKE_BUILD_TYPE=Release ${launcher})
run("${CMAKE_COMMAND}" --build "${WORK_DIR}/build")
run("${WORK_DIR}/build/consumer")
message(STATUS "consumer output: ${LAST_OUTPUT}")
