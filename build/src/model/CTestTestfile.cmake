# CMake generated Testfile for 
# Source directory: /work/main/src/model
# Build directory: /work/main/build/src/model
# 
# This file includes the relevant testing commands required for 
# testing this directory and lists subdirectories to be tested as well.
