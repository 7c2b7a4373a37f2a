// The test executables' main (instead of gtest_main's): gtest's, except that a run in which every
// selected test skipped and none failed exits with 77, which ctest reports as skipped (Note [a
// process per suite] in cmake/tapeline.cmake): a suite of CUDA tests on a machine without a device
// shows as skipped, not as passed.
#include <gtest/gtest.h>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  const ::testing::UnitTest& run = *::testing::UnitTest::GetInstance();
  if (rc == 0 && run.test_to_run_count() > 0 && run.successful_test_count() == 0 && run.failed_test_count() == 0 &&
      run.skipped_test_count() == run.test_to_run_count())
    return 77;
  return rc;
}
