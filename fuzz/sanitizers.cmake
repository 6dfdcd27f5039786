# Included by the top-level CMakeLists.txt before any target when
# PIPEC_BUILD_FUZZERS is ON: every library of that build gets AddressSanitizer,
# UndefinedBehaviorSanitizer (aborting on the first report) and libFuzzer's
# coverage instrumentation; fuzz/CMakeLists.txt links the targets with
# -fsanitize=fuzzer. tools/fuzz.sh configures such a build (build-fuzz/).
if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "PIPEC_BUILD_FUZZERS needs clang and libFuzzer: configure with "
                      "-DCMAKE_C_COMPILER=clang-22 -DCMAKE_CXX_COMPILER=clang++-22 (tools/fuzz.sh does)")
endif()
# vptr is off: LLVM/MLIR are built without RTTI, so the check cannot work on
# their classes (and would need typeinfo the libraries do not export).
add_compile_options(-fsanitize=address,undefined,fuzzer-no-link -fno-sanitize-recover=undefined
                    -fno-sanitize=vptr -fno-omit-frame-pointer)
add_link_options(-fsanitize=address,undefined -fno-sanitize=vptr)
