# CMake generated Testfile for 
# Source directory: /work/main/tests/core
# Build directory: /work/main/build/tests/core
# 
# This file includes the relevant testing commands required for 
# testing this directory and lists subdirectories to be tested as well.
add_test([=[test_core]=] "/work/main/build/tests/core/test_core")
set_tests_properties([=[test_core]=] PROPERTIES  LABELS "unit" WORKING_DIRECTORY "/work/main" _BACKTRACE_TRIPLES "/work/main/cmake/OscarHelpers.cmake;20;add_test;/work/main/tests/core/CMakeLists.txt;1;oscar_add_test;/work/main/tests/core/CMakeLists.txt;0;")
