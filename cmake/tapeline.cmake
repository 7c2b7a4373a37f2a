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

# TAPELINE_FUZZ: every target instrumented for libFuzzer's coverage and checked by ASan and UBSan
# (tests/fuzz/CMakeLists.txt links the harnesses with -fsanitize=fuzzer). Needs clang.
if(TAPELINE_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "TAPELINE_FUZZ=ON needs clang (libFuzzer): configure with -DCMAKE_CXX_COMPILER=clang++ "
                        "(scripts/fuzz does); got ${CMAKE_CXX_COMPILER_ID}")
  endif()
  if(TAPELINE_SANITIZE)
    message(FATAL_ERROR "TAPELINE_FUZZ=ON brings its own sanitizers (address, undefined): leave TAPELINE_SANITIZE empty")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined
                      -fno-omit-frame-pointer -gline-tables-only)
  add_link_options(-fsanitize=address,undefined)
  message(STATUS "tapeline: libFuzzer harnesses, ASan + UBSan")
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
