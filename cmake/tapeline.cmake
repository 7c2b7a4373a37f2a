# TAPELINE_SANITIZE=thread|address|undefined: compile and link everything with that sanitizer
# (-fsanitize=..., frame pointers, debug info). See docs/ARCHITECTURE.md, "Engine internals".
set(TAPELINE_SANITIZE "" CACHE STRING "Sanitizer for every target: thread, address, undefined or empty (none)")
set_property(CACHE TAPELINE_SANITIZE PROPERTY STRINGS "" thread address undefined)
if(TAPELINE_SANITIZE)
  if(NOT TAPELINE_SANITIZE MATCHES "^(thread|address|undefined)$")
    message(FATAL_ERROR "TAPELINE_SANITIZE='${TAPELINE_SANITIZE}' is not accepted; accepted: thread, address, undefined")
  endif()
  add_compile_options(-fsanitize=${TAPELINE_SANITIZE} -fno-omit-frame-pointer -g)
  add_link_options(-fsanitize=${TAPELINE_SANITIZE})
  message(STATUS "tapeline: building with -fsanitize=${TAPELINE_SANITIZE}")
endif()

# tapeline_library(NAME SOURCES... DEPS ...): a folder's library with the ATen precompiled header.
function(tapeline_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} ${ARG_SOURCES})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR})
  target_link_libraries(${name} PUBLIC ${ARG_DEPS})
  target_precompile_headers(${name} PRIVATE <ATen/ATen.h> <vector> <string> <memory>)
endfunction()

# tapeline_test(NAME LABEL SOURCES... DEPS ...): one gtest binary, its tests registered with ctest
# under LABEL. Tests that need CUDA have `Cuda` or `Gpu` in their name, skip themselves with
# GTEST_SKIP when no device is present, and carry the label `gpu` instead (ctest -L gpu).
function(tapeline_test name label)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} tl_test_common GTest::gtest GTest::gtest_main)
  # Its own PCH: REUSE_FROM a library would mix -fPIC and -fPIE, and GCC then ignores the PCH.
  target_precompile_headers(${name} PRIVATE <torch/torch.h> <gtest/gtest.h> <vector> <string> <memory>)
  gtest_discover_tests(${name} DISCOVERY_MODE PRE_TEST TEST_FILTER "*-*Cuda*:*Gpu*"
                       PROPERTIES LABELS ${label} DISCOVERY_TIMEOUT 60)
  gtest_discover_tests(${name} DISCOVERY_MODE PRE_TEST TEST_FILTER "*Cuda*:*Gpu*"
                       PROPERTIES LABELS gpu DISCOVERY_TIMEOUT 60)
endfunction()
