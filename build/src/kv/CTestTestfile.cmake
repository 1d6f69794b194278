# CMake generated Testfile for 
# Source directory: /work/main/src/kv
# Build directory: /work/main/build/src/kv
# 
# This file includes the relevant testing commands required for 
# testing this directory and lists subdirectories to be tested as well.
