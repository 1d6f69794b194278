# Shared CMake helpers: strict warnings for our own targets and oscar_add_test().

function(oscar_strict_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wno-unused-parameter -Wno-format-zero-length>)
  if(OSCAR_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
  endif()
endfunction()

# The real Qwen3 tokenizer that tests and bench_model read is kept compressed in the repository
# (7.0 MB of JSON, 1.4 MB as tokenizer.json.tar.xz: the tree a GPU device call carries is limited
# to 64 MiB); configure unpacks it into <build>/data/qwen3_tokenizer, named by
# OSCAR_QWEN3_TOKENIZER_DIR (a cache path for the targets, a compile definition for the tests).
function(oscar_unpack_test_data)
  set(archive ${PROJECT_SOURCE_DIR}/tests/data/qwen3_tokenizer/tokenizer.json.tar.xz)
  set(dir ${PROJECT_BINARY_DIR}/data/qwen3_tokenizer)
  set_property(DIRECTORY ${PROJECT_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${archive})
  if(${archive} IS_NEWER_THAN ${dir}/tokenizer.json)
    file(ARCHIVE_EXTRACT INPUT ${archive} DESTINATION ${dir})
    file(TOUCH ${dir}/tokenizer.json)
  endif()
  set(OSCAR_QWEN3_TOKENIZER_DIR ${dir} CACHE INTERNAL "the unpacked Qwen3 tokenizer (test data)")
endfunction()

# oscar_add_test(name SOURCES a.cpp b.cpp LIBS oscar_x LABELS unit)
# Labels: unit (fast, CPU), model (embedded tiny-qwen3 vs goldens), slow, cuda.
# Tests run from the repository root so that paths like models/tiny-qwen3 resolve.
function(oscar_add_test name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gtest_main)
  target_compile_definitions(${name} PRIVATE OSCAR_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
                                               OSCAR_QWEN3_TOKENIZER_DIR="${OSCAR_QWEN3_TOKENIZER_DIR}")
  oscar_strict_warnings(${name})
  add_test(NAME ${name} COMMAND ${name} WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  if(NOT ARG_LABELS)
    set(ARG_LABELS unit)
  endif()
  # Idle OpenMP threads sleep instead of spinning (see core/omp_env.h).
  set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABELS}" ENVIRONMENT "OMP_WAIT_POLICY=PASSIVE")
endfunction()
