# Test labels (docs/build.md, "Test tiers"), shared by test/ and the kernels'
# tests that runtime/kernels adds on its own.
include_guard(GLOBAL)

# The labels of a GoogleTest executable's discovered tests: set when ctest
# reads them (gtest_discover_tests' PROPERTIES would split the list).
function(pipec_gtest_labels target labels)
  set(script ${CMAKE_CURRENT_BINARY_DIR}/${target}_labels.cmake)
  file(WRITE ${script} "if(DEFINED ${target}_TESTS)\n  set_tests_properties(\${${target}_TESTS} PROPERTIES LABELS \"${labels}\")\nendif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${script})
endfunction()

# The targets the tests need: every executable and library of the build.
function(pipec_collect_build_targets directory out)
  get_property(targets DIRECTORY ${directory} PROPERTY BUILDSYSTEM_TARGETS)
  set(found)
  foreach(target ${targets})
    get_target_property(type ${target} TYPE)
    if(type MATCHES "EXECUTABLE|LIBRARY" AND NOT type STREQUAL "INTERFACE_LIBRARY")
      list(APPEND found ${target})
    endif()
  endforeach()
  get_property(subdirectories DIRECTORY ${directory} PROPERTY SUBDIRECTORIES)
  foreach(subdirectory ${subdirectories})
    pipec_collect_build_targets(${subdirectory} below)
    list(APPEND found ${below})
  endforeach()
  set(${out} ${found} PARENT_SCOPE)
endfunction()

# check-<label>: builds what the tests need, then runs the tests of that
# label (LLVM's check-* targets); check runs them all. PIPEC_CHECK_JOBS sets
# ctest's -j.
function(pipec_add_check_targets)
  set(PIPEC_CHECK_JOBS 2 CACHE STRING "ctest -j of the check-* targets")
  pipec_collect_build_targets(${CMAKE_SOURCE_DIR} targets)
  foreach(label "" quick slow analysis compiler dialects passes runtime lint lit unit e2e conformance cuda gpu security)
    set(name check)
    set(select)
    if(label)
      set(name check-${label})
      set(select -L "^${label}$")
    endif()
    add_custom_target(${name}
      COMMAND ${CMAKE_CTEST_COMMAND} --test-dir ${CMAKE_BINARY_DIR} ${select} --output-on-failure -j ${PIPEC_CHECK_JOBS}
      USES_TERMINAL
      COMMENT "ctest ${select}")
    if(targets)
      add_dependencies(${name} ${targets})
    endif()
  endforeach()
endfunction()
