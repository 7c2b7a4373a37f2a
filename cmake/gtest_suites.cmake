# Registers one gtest executable's tests with ctest, a process per suite (Note [a process per
# suite] in cmake/tapeline.cmake). ctest includes this file through the executable's
# TEST_INCLUDE_FILES entry (tapeline_test), with these variables set:
#   TL_NAME     the executable's target        TL_EXE    its file
#   TL_LABEL    its ctest label
#   TL_COST     ctest COST of its tests        TL_ALONE  suites whose tests run a process each
#   TL_ENV      ENVIRONMENT of its tests       TL_DIR    the working directory
#   TL_OUT      the generated file of add_test calls (rewritten when the executable is newer)
# Tests with `Cuda` or `Gpu` in their name run a process each under the label `gpu`.

function(tl_gtest_suites_write)
  execute_process(COMMAND "${TL_EXE}" --gtest_list_tests
                  WORKING_DIRECTORY "${TL_DIR}" OUTPUT_VARIABLE out ERROR_VARIABLE err
                  RESULT_VARIABLE rc TIMEOUT 60)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${TL_EXE} --gtest_list_tests failed (exit ${rc}): ${err}")
  endif()
  # Suite lines are `Suite.` and test lines `  Name`, either followed by `  # GetParam() = ...`.
  string(REGEX REPLACE " *#[^\n]*" "" out "${out}")
  string(REPLACE ";" "" out "${out}")
  string(REPLACE "\n" ";" lines "${out}")
  set(suites "")
  set(suite "")
  foreach(line IN LISTS lines)
    if(line MATCHES "^([^ ]+)\\.$")
      set(suite "${CMAKE_MATCH_1}")
      list(APPEND suites "${suite}")
      set("tests_${suite}" "")
    elseif(suite AND line MATCHES "^  ([^ ]+)$")
      list(APPEND "tests_${suite}" "${CMAKE_MATCH_1}")
    endif()
  endforeach()

  set(common "WORKING_DIRECTORY [==[${TL_DIR}]==] SKIP_RETURN_CODE 77")
  if(TL_ENV)
    string(APPEND common " ENVIRONMENT [==[${TL_ENV}]==]")
  endif()
  set(text "")
  macro(tl_add name filter labels cost)
    string(APPEND text "add_test([==[${name}]==] [==[${TL_EXE}]==] [==[--gtest_filter=${filter}]==])\n"
                       "set_tests_properties([==[${name}]==] PROPERTIES LABELS ${labels} COST ${cost} ${common})\n")
  endmacro()
  foreach(suite IN LISTS suites)
    set(cpu "")
    foreach(test IN LISTS "tests_${suite}")
      if("${suite}.${test}" MATCHES "Cuda|Gpu")
        tl_add("${suite}.${test}" "${suite}.${test}" gpu 0)
      else()
        list(APPEND cpu "${test}")
      endif()
    endforeach()
    list(LENGTH cpu n)
    if(n EQUAL 0)
      continue()
    endif()
    # COST orders a clean clone's first run (ctest -j starts the costliest first; later runs go by
    # the times ctest measured): an ALONE suite's tests take tens of seconds each, a group about as
    # long as it has tests.
    list(FIND TL_ALONE "${suite}" alone)  # (no IN_LIST: ctest runs this without a policy version)
    if(NOT alone EQUAL -1)
      set(cost 50)
    else()
      set(cost ${n})
    endif()
    if(cost LESS TL_COST)
      set(cost ${TL_COST})
    endif()
    if(NOT alone EQUAL -1 OR n EQUAL 1)
      foreach(test IN LISTS cpu)
        tl_add("${suite}.${test}" "${suite}.${test}" "${TL_LABEL}" ${cost})
      endforeach()
    else()
      tl_add("${suite}.*" "${suite}.*-*Cuda*:*Gpu*" "${TL_LABEL}" ${cost})
    endif()
  endforeach()
  file(WRITE "${TL_OUT}.tmp" "${text}")
  file(RENAME "${TL_OUT}.tmp" "${TL_OUT}")
endfunction()

if(NOT EXISTS "${TL_EXE}")
  add_test("${TL_NAME}_NOT_BUILT" "${TL_NAME}_NOT_BUILT")  # fails: "Could not find executable"
else()
  if(NOT EXISTS "${TL_OUT}" OR "${TL_EXE}" IS_NEWER_THAN "${TL_OUT}")
    tl_gtest_suites_write()
  endif()
  include("${TL_OUT}")
endif()
