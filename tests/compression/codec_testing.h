#pragma once
// Helpers for the stateless codec tests: round trips, the header size formula of payload.h
// computed independently, and byte-for-byte payload comparison.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>

#include "compression/codecs/common.h"
#include "compression/spec.h"

namespace tl::testing {

inline at::Tensor round_trip(const CompressorPtr& c, const at::Tensor& x) {
  CodecContext ctx;
  return c->decode(c->encode(x, ctx), ctx);
}

/// payload.h: 8 fixed bytes + 8 per dim + 8 per param + 8 for the body length.
inline int64_t header_formula(int64_t ndim, int64_t nparams) { return 16 + 8 * (ndim + nparams); }

/// Same codec, dtype, shape, params and body bytes.
inline ::testing::AssertionResult same_payload(const Payload& a, const Payload& b) {
  if (a.codec != b.codec || a.dtype != b.dtype || a.shape != b.shape || a.params != b.params)
    return ::testing::AssertionFailure() << "headers differ: codec " << a.codec << "/" << b.codec << ", params "
                                         << c10::IntArrayRef(a.params) << " / " << c10::IntArrayRef(b.params);
  const auto sa = a.serialize(), sb = b.serialize();
  if (sa != sb) {
    size_t i = 0;
    while (i < std::min(sa.size(), sb.size()) && sa[i] == sb[i]) ++i;
    return ::testing::AssertionFailure() << "bodies differ: " << sa.size() << " vs " << sb.size()
                                         << " bytes, first difference at byte " << i;
  }
  return ::testing::AssertionSuccess();
}

/// The error message of f(), or "" if it did not throw.
template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

#define EXPECT_ERROR_CONTAINS(stmt, text)                                           \
  do {                                                                              \
    const std::string msg_ = ::tl::testing::error_of([&] { stmt; });                \
    EXPECT_NE(msg_.find(text), std::string::npos) << "error was: '" << msg_ << "'"; \
  } while (0)

}  // namespace tl::testing
