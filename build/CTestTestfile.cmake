# CMake generated Testfile for 
# Source directory: /work/main
# Build directory: /work/main/build
# 
# This file includes the relevant testing commands required for 
# testing this directory and lists subdirectories to be tested as well.
subdirs("src/core")
subdirs("src/format")
subdirs("src/quant")
subdirs("src/kernels")
subdirs("src/tokenizer")
subdirs("src/kv")
subdirs("src/model")
subdirs("src/calib")
subdirs("src/engine")
subdirs("src/server")
subdirs("apps")
subdirs("tests")
