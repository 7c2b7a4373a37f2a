# tapeline_library(NAME SOURCES... DEPS ...): a folder's library with the ATen precompiled header.
function(tapeline_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} ${ARG_SOURCES})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR})
  target_link_libraries(${name} PUBLIC ${ARG_DEPS})
  target_precompile_headers(${name} PRIVATE <ATen/ATen.h> <vector> <string> <memory>)
endfunction()

# tapeline_test(NAME LABEL SOURCES... DEPS ...): one gtest binary, its tests registered with ctest
# under LABEL (tests needing CUDA skip themselves with GTEST_SKIP and also carry the `gpu` label
# through their own name filter, see tests/CMakeLists.txt).
function(tapeline_test name label)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} tl_test_common GTest::gtest GTest::gtest_main)
  # Its own PCH: REUSE_FROM a library would mix -fPIC and -fPIE, and GCC then ignores the PCH.
  target_precompile_headers(${name} PRIVATE <torch/torch.h> <gtest/gtest.h> <vector> <string> <memory>)
  gtest_discover_tests(${name} DISCOVERY_MODE PRE_TEST PROPERTIES LABELS ${label} DISCOVERY_TIMEOUT 60)
endfunction()
