# Build-time choices that do not change what pipec does (docs/build.md):
# lld as the linker and one precompiled header for the MLIR translation
# units. The Release optimization level (-O2) is set in the top-level
# CMakeLists.txt, before project().

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

# ---------------------------------------------------------------- precompiled header
# Every MLIR translation unit spends seconds parsing the same LLVM/MLIR
# headers. pipec_mlir_pch (an object library with an empty source) compiles
# them once into a precompiled header; pipec_use_mlir_pch(TARGET) makes a
# target reuse it. Reuse needs the same compile flags, so only targets that
# add no compile options of their own (defines and include paths are fine)
# should use it. Only external headers go in: pipec's own headers change
# often and would rebuild the PCH, and everything after it, each time.
option(PIPEC_PCH "Precompile the LLVM/MLIR headers the compiler's sources share" ON)
set(PIPEC_MLIR_PCH_HEADERS
  <algorithm> <functional> <map> <memory> <optional> <set> <sstream> <string> <vector>
  <llvm/ADT/DenseMap.h> <llvm/ADT/DenseSet.h> <llvm/ADT/STLExtras.h> <llvm/ADT/SetVector.h>
  <llvm/ADT/StringMap.h> <llvm/ADT/StringSet.h> <llvm/ADT/TypeSwitch.h>
  <llvm/Support/raw_ostream.h>
  <mlir/Bytecode/BytecodeOpInterface.h>
  <mlir/IR/Builders.h> <mlir/IR/BuiltinAttributes.h> <mlir/IR/BuiltinOps.h>
  <mlir/IR/BuiltinTypes.h> <mlir/IR/Diagnostics.h> <mlir/IR/Dialect.h>
  <mlir/IR/DialectRegistry.h> <mlir/IR/IRMapping.h> <mlir/IR/MLIRContext.h>
  <mlir/IR/OpDefinition.h> <mlir/IR/OpImplementation.h> <mlir/IR/SymbolTable.h>
  <mlir/Interfaces/InferTypeOpInterface.h> <mlir/Interfaces/SideEffectInterfaces.h>
  <mlir/Dialect/Func/IR/FuncOps.h>
  <mlir/Pass/Pass.h> <mlir/Pass/PassManager.h>)

# Called once, at the top level, after the LLVM/MLIR include directories and
# definitions are set (the PCH target must see the same ones as its users).
function(pipec_add_mlir_pch)
  if(NOT PIPEC_PCH)
    return()
  endif()
  set(src ${CMAKE_BINARY_DIR}/pipec_mlir_pch.cpp)
  if(NOT EXISTS ${src})
    file(WRITE ${src} "// The owner of pipec's MLIR precompiled header (cmake/BuildSpeed.cmake).\n")
  endif()
  add_library(pipec_mlir_pch OBJECT ${src})
  target_precompile_headers(pipec_mlir_pch PRIVATE ${PIPEC_MLIR_PCH_HEADERS})
endfunction()

function(pipec_use_mlir_pch target)
  if(TARGET pipec_mlir_pch)
    target_precompile_headers(${target} REUSE_FROM pipec_mlir_pch)
  endif()
endfunction()
