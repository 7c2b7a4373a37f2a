#pragma once
// Fuzz harnesses (docs/FUZZING.md). One harness per input tapeline reads from other people or
// other processes. A harness is a function of arbitrary bytes that must return normally, whether
// it accepted the input or rejected it with an error (any std::exception with a message). A
// crash, a sanitizer report, an exception of the wrong kind (std::bad_alloc, std::length_error:
// an allocation sized by the input) or a broken invariant (TL_FUZZ_CHECK) is a finding.
//
// Each harness is written once and built two ways:
//  - with libFuzzer (clang, -DTL_LIBFUZZER, scripts/fuzz): one executable per harness, coverage-
//    guided, under ASan and UBSan;
//  - into the normal test suite (tests/fuzz/replay_test.cpp): every file of its corpus
//    (tests/fuzz/corpus/<name>/) is run through it, so each finding stays fixed.
//
//   TL_FUZZ_TARGET(spec) {  // `data`, `size` in scope
//     tl::parse_compressor(std::string(reinterpret_cast<const char*>(data), size));
//   }

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace tl::fuzz {

using Harness = void (*)(const uint8_t* data, size_t size);

/// The harnesses linked into this binary, by name (replay build).
std::map<std::string, Harness>& harnesses();
struct Registration {
  Registration(const char* name, Harness h) { harnesses()[name] = h; }
};

/// Runs one input: true if accepted, false if rejected (an exception, its message in `why` when
/// given); findings abort with a message.
bool run_one(Harness h, const uint8_t* data, size_t size, std::string* why = nullptr);

/// Aborts (a finding) with `what` when `ok` is false.
void check(bool ok, const std::string& what);
#define TL_FUZZ_CHECK(cond, what) ::tl::fuzz::check(static_cast<bool>(cond), std::string(#cond ": ") + (what))

/// A file holding `bytes` in this process's scratch directory (replaced on each call with the same
/// `name`; removed at exit). Returns its path.
std::string write_file(const std::string& name, const uint8_t* data, size_t size);
std::string write_file(const std::string& name, const std::string& bytes);
/// This process's scratch directory (created on first use).
std::string scratch_dir();

/// Splits an input into parts: reads a byte, a little-endian u16 length-prefixed string, or the rest.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  uint8_t byte() { return p_ < end_ ? *p_++ : 0; }
  std::string chunk();  // u16 length, then that many bytes (fewer at the end)
  std::string rest() {
    std::string s(reinterpret_cast<const char*>(p_), static_cast<size_t>(end_ - p_));
    p_ = end_;
    return s;
  }
  const uint8_t* ptr() const { return p_; }
  size_t left() const { return static_cast<size_t>(end_ - p_); }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

}  // namespace tl::fuzz

#ifdef TL_LIBFUZZER
#define TL_FUZZ_TARGET(name)                                                     \
  static void tl_fuzz_##name(const uint8_t* data, size_t size);                  \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {      \
    ::tl::fuzz::run_one(tl_fuzz_##name, data, size);                             \
    return 0;                                                                    \
  }                                                                              \
  static void tl_fuzz_##name(const uint8_t* data, size_t size)
#else
#define TL_FUZZ_TARGET(name)                                                     \
  static void tl_fuzz_##name(const uint8_t* data, size_t size);                  \
  static ::tl::fuzz::Registration tl_fuzz_registration_##name(#name, tl_fuzz_##name); \
  static void tl_fuzz_##name(const uint8_t* data, size_t size)
#endif
