# Shared CMake helpers: strict warnings for our own targets and oscar_add_test().

function(oscar_strict_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wno-unused-parameter -Wno-format-zero-length>)
  if(OSCAR_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
  endif()
endfunction()

# oscar_add_test(name SOURCES a.cpp b.cpp LIBS oscar_x LABELS unit)
# Labels: unit (fast, CPU), model (embedded tiny-qwen3 vs goldens), slow, cuda.
# Tests run from the repository root so that paths like models/tiny-qwen3 resolve.
function(oscar_add_test name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gtest_main)
  target_compile_definitions(${name} PRIVATE OSCAR_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  oscar_strict_warnings(${name})
  add_test(NAME ${name} COMMAND ${name} WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  if(NOT ARG_LABELS)
    set(ARG_LABELS unit)
  endif()
  # Idle OpenMP threads sleep instead of spinning (see core/omp_env.h).
  set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABELS}" ENVIRONMENT "OMP_WAIT_POLICY=PASSIVE")
endfunction()
