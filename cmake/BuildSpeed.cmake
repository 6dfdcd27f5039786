# Build-time choices that do not change what pipec does (docs/build.md).

# ---------------------------------------------------------------- linker
# lld links pipec's executables (libMLIR.so, libLLVM.so, protobuf, onnx)
# several times faster than ld.bfd. Only for C/C++ links: nvcc does its own.
option(PIPEC_USE_LLD "Link with lld (-fuse-ld=lld) when the compiler accepts it" ON)
if(PIPEC_USE_LLD AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  include(CheckCXXSourceCompiles)
  set(CMAKE_REQUIRED_LINK_OPTIONS -fuse-ld=lld)
  check_cxx_source_compiles("int main() { return 0; }" PIPEC_HAVE_LLD)
  unset(CMAKE_REQUIRED_LINK_OPTIONS)
  if(PIPEC_HAVE_LLD)
    add_link_options("$<$<LINK_LANGUAGE:C,CXX>:-fuse-ld=lld>")
  endif()
endif()
