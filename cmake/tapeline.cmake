# TAPELINE_SANITIZE=thread|address|undefined|address,undefined: compile and link everything with
# that sanitizer (-fsanitize=..., frame pointers, debug info; undefined behaviour is fatal, so a test
# that meets it fails). See docs/ARCHITECTURE.md, "Engine internals", and docs/FUZZING.md.
set(TAPELINE_SANITIZE "" CACHE STRING
    "Sanitizer for every target: thread, address, undefined, address,undefined or empty (none)")
set_property(CACHE TAPELINE_SANITIZE PROPERTY STRINGS "" thread address undefined "address,undefined")
if(TAPELINE_SANITIZE)
  if(NOT TAPELINE_SANITIZE MATCHES "^(thread|address|undefined|address,undefined)$")
    message(FATAL_ERROR "TAPELINE_SANITIZE='${TAPELINE_SANITIZE}' is not accepted; accepted: thread, address, "
                        "undefined, address,undefined")
  endif()
  add_compile_options(-fsanitize=${TAPELINE_SANITIZE} -fno-omit-frame-pointer -g)
  if(TAPELINE_SANITIZE MATCHES "undefined")
    add_compile_options(-fno-sanitize-recover=undefined)
  endif()
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
# Note [one library PCH]: the first library (tl_autograd) compiles it and the others reuse it
# (REUSE_FROM), instead of five copies of 17 s of a core each. GCC accepts a PCH where the macros
# it mentions are defined alike; the libraries' extra definitions (TL_HAVE_OPENCV,
# TAPELINE_CUDA_KERNELS, Boost's) do not occur in ATen, and -Winvalid-pch would say otherwise.
# Clang (the fuzz build) refuses a PCH whose command-line macros the file does not define alike,
# but accepts definitions the PCH did not have: every library has tl_autograd's (libtorch's USE_*,
# GLOG's), and tl_tasks adds Boost's and TL_HAVE_OPENCV. Sharing it saves the fuzz build
# four clang PCHs (35-45 s each in CI's log, built beside the suite at the lowest priority).
function(tapeline_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} ${ARG_SOURCES})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR})
  target_link_libraries(${name} PUBLIC ${ARG_DEPS})
  tapeline_library_pch(${name})
endfunction()

# tapeline_library_pch(NAME): the library PCH above for another library (static, object or shared:
# compiled with -fPIC) outside tapeline_library, such as the tests' and the labs' helpers; about
# 10 s of a core less per file (16.1 s against 4.4 s for labs/lab2/sign_common.cpp).
function(tapeline_library_pch name)
  get_property(owner GLOBAL PROPERTY TL_LIB_PCH_OWNER)
  if(owner AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    target_precompile_headers(${name} REUSE_FROM ${owner})
  else()
    target_precompile_headers(${name} PRIVATE <ATen/ATen.h> <vector> <string> <memory>)
    if(NOT owner)
      set_property(GLOBAL PROPERTY TL_LIB_PCH_OWNER ${name})
    endif()
  endif()
endfunction()

# tapeline_executable_pch(NAME): the one precompiled <ATen/ATen.h> (and <gtest/gtest.h> where the
# tests are built) that every test and benchmark executable reuses, compiled once instead of once
# per executable (about 12 s of a core each). Its owner is an executable, tl_exe_pch: a library's
# PCH is compiled with -fPIC, an executable with -fPIE, and GCC ignores a PCH built with the other
# one. Note [a light executable PCH]: the few sources that use libtorch's C++ API (torch::nn,
# torch::optim as references) include <torch/torch.h> themselves. A precompiled <torch/torch.h> is
# 620 MB, and loading it costs every translation unit about 6 s of a core more than this one
# (10.8 s against 4.7 s for tests/autograd/shape_test.cpp), which was a third of the whole build.
function(tapeline_executable_pch name)
  if(NOT TARGET tl_exe_pch)
    set(main ${PROJECT_BINARY_DIR}/tl_exe_pch.cpp)
    if(NOT EXISTS ${main})
      file(WRITE ${main} "// The owner of the executables' precompiled header (cmake/tapeline.cmake).\nint main() { return 0; }\n")
    endif()
    add_executable(tl_exe_pch ${main})
    target_link_libraries(tl_exe_pch PRIVATE tl_torch)
    set(headers <ATen/ATen.h> <vector> <string> <memory>)
    set(options "")
    if(TARGET GTest::gtest)
      target_link_libraries(tl_exe_pch PRIVATE GTest::gtest)
      list(APPEND headers <gtest/gtest.h>)
      get_target_property(options GTest::gtest INTERFACE_COMPILE_OPTIONS)
      if(NOT options)
        set(options "")
      endif()
    endif()
    target_precompile_headers(tl_exe_pch PRIVATE ${headers})
    # GCC uses a PCH only where the macros it saw are defined alike: gtest's options
    # (-DGTEST_HAS_PTHREAD=1) go to every user, the benchmarks too (GTest::gtest is visible in
    # tests/ only).
    set_property(GLOBAL PROPERTY TL_EXE_PCH_OPTIONS "${options}")
  endif()
  target_precompile_headers(${name} REUSE_FROM tl_exe_pch)
  get_property(options GLOBAL PROPERTY TL_EXE_PCH_OPTIONS)
  if(options)
    target_compile_options(${name} PRIVATE ${options})
  endif()
endfunction()

# tapeline_test(NAME LABEL [COST N] [ALONE SUITE...] SOURCES... DEPS ...): one gtest binary, its
# tests registered with ctest under LABEL, a process per suite (Note [a process per suite]) except
# the ALONE suites, a process per test. Tests that need CUDA have `Cuda` or `Gpu` in their name,
# skip themselves with GTEST_SKIP when no device is present, run a process each and carry the
# label `gpu` instead (ctest -L gpu).
#
# Note [a process per suite]. Each test process starts libtorch first: 0.3 to 0.7 s of a core
# before its first test, and CI ran 576 of them (about 250 s of a core, a tenth of ctest). A suite
# of in-process tests now runs as one ctest test, `Suite.*` (test_compression's 190 tests: 13 s in
# one process against over 90 s one by one); a suite whose tests start processes or train for tens
# of seconds stays one process per test (ALONE), so that ctest -j spreads them and a failure names
# its test. To run one test of a group: the executable with --gtest_filter=Suite.Test. The
# executables' main (tests/common/main.cpp) exits with 77, ctest's "skipped", when every test it
# ran skipped and none failed. ctest lists the tests when it starts (cmake/gtest_suites.cmake),
# again only after the executable changed.
function(tapeline_test name label)
  cmake_parse_arguments(ARG "" "COST" "SOURCES;DEPS;ALONE" ${ARGN})
  if(NOT ARG_COST)
    set(ARG_COST 0)
  endif()
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} tl_test_common tl_test_main GTest::gtest tl_passive_wait)
  tapeline_executable_pch(${name})
  # Note [tests at -O1]: a test file is mostly gtest's macros and calls into the libraries, which
  # stay at -O3 (as do tl_test_common's numeric helpers and the PCH, which GCC accepts at any -O
  # above 0: both define __OPTIMIZE__). -O1 compiles the test files about a fifth faster (8 files:
  # 156 s -> 122 s of a core; tests/compression/cpu_paths_test.cpp 17.0 s -> 10.7 s) and runs them
  # as fast (test_compression, every test: 10.5 s and 10.0 s of user time). No -ffast-math and no
  # FMA target, so the test code's floating point is the same at either level. Release only: a
  # Debug build keeps its -O0.
  target_compile_options(${name} PRIVATE $<$<CONFIG:Release>:-O1>)
  # Under AddressSanitizer against libtorch 1.x, LeakSanitizer skips one known libtorch leak
  # (tests/sanitizers/lsan_libtorch1.supp says which and why); the processes a test starts inherit it.
  set(env "")
  if(TAPELINE_SANITIZE MATCHES "address" AND Torch_VERSION VERSION_LESS 2.0)
    set(env "LSAN_OPTIONS=suppressions=${PROJECT_SOURCE_DIR}/tests/sanitizers/lsan_libtorch1.supp")
  endif()
  # COST: ctest -j starts the costliest tests first (a clean clone has no timings to go by).
  set(include ${CMAKE_CURRENT_BINARY_DIR}/${name}_suites_include.cmake)
  file(GENERATE OUTPUT ${include} CONTENT
"set(TL_NAME ${name})
set(TL_EXE [==[$<TARGET_FILE:${name}>]==])
set(TL_LABEL ${label})
set(TL_COST ${ARG_COST})
set(TL_ALONE [==[${ARG_ALONE}]==])
set(TL_ENV [==[${env}]==])
set(TL_DIR [==[${CMAKE_CURRENT_BINARY_DIR}]==])
set(TL_OUT [==[${CMAKE_CURRENT_BINARY_DIR}/${name}_suites.cmake]==])
include([==[${PROJECT_SOURCE_DIR}/cmake/gtest_suites.cmake]==])
")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${include})
endfunction()
