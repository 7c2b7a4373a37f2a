// Lab 2: the test your sign compressor must pass (it fails on the skeleton until encode and
// decode are written). Built twice: lab2_skeleton_test (your file) and lab2_solution_test.
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/autograd.h"
#include "compression/boundary.h"
#include "compression/spec.h"
#include "labs/lab2/sign_compressor.h"
#include "layers/nn/nn.h"

namespace tl::lab2 {
namespace {

// x^ = mean_j |x_rj| * (+1 where x >= 0, -1 elsewhere), row by row (rows: dim 0).
at::Tensor expected_decode(const at::Tensor& x) {
  const int64_t rows = sign_rows(x.sizes());
  at::Tensor flat = x.reshape({rows, -1}).to(at::kFloat);                 // (rows, n)
  at::Tensor s = flat.abs().mean(1, /*keepdim=*/true);                     // (rows, 1)
  at::Tensor sign = at::where(flat.ge(0), at::ones_like(flat), -at::ones_like(flat));
  return (s * sign).to(x.scalar_type()).view(x.sizes());
}

double rel_error(const at::Tensor& x, const at::Tensor& y) {
  return (x - y).norm().item<double>() / x.norm().item<double>();
}

TEST(SignCompressor, PayloadIsOneBitPerEntryPlusOneScalePerSample) {
  SignCompressor c;
  at::Tensor x = at::randn({4, 3, 5, 5});  // 4 samples of 75 entries
  Payload p = c.encode(x, {});
  const size_t expected_body = 4 * 4 + (300 + 7) / 8;  // 4 fp32 scales + 300 bits
  EXPECT_EQ(p.body_bytes(), expected_body) << "body: 4 scales (16 bytes) then ceil(300 / 8) = 38 bytes of sign bits";
  EXPECT_EQ(p.nbytes(), p.header_bytes() + expected_body);
  EXPECT_EQ(p.shape, x.sizes().vec());
  EXPECT_EQ(p.dtype, at::kFloat);
}

TEST(SignCompressor, DecodesToScaledSigns) {
  SignCompressor c;
  at::Tensor x = at::randn({3, 10});
  x[1][4] = 0.0;  // sign(0) is sent as +
  at::Tensor y = c.decode(c.encode(x, {}), {});
  ASSERT_EQ(y.sizes(), x.sizes());
  at::Tensor want = expected_decode(x);
  EXPECT_TRUE(at::allclose(y, want, 1e-6, 1e-6)) << "decoded:\n" << y << "\nexpected mean|x_r| * sign(x):\n" << want;
}

TEST(SignCompressor, ErrorOfGaussianMessagesIsSqrtOneMinusTwoOverPi) {
  SignCompressor c;
  at::manual_seed(0);
  at::Tensor x = at::randn({8, 4096});
  at::Tensor y = c.decode(c.encode(x, {}), {});
  const double theory = std::sqrt(1.0 - 2.0 / M_PI);  // 0.6028
  EXPECT_NEAR(rel_error(x, y), theory, 0.01);
  // The mean of |x| is the best scale: 10% more or less is worse.
  EXPECT_LT(rel_error(x, y), rel_error(x, y * 1.1));
  EXPECT_LT(rel_error(x, y), rel_error(x, y * 0.9));
}

TEST(SignCompressor, SurvivesTheWireAndKeepsTheDtype) {
  SignCompressor c;
  at::Tensor x = at::randn({5, 7}).to(at::kHalf);
  Payload p = c.encode(x, {});
  std::vector<uint8_t> bytes = p.serialize();
  EXPECT_EQ(bytes.size(), p.nbytes());
  Payload q = Payload::deserialize(bytes.data(), bytes.size());
  at::Tensor y = c.decode(q, {});
  EXPECT_EQ(y.scalar_type(), at::kHalf);
  EXPECT_TRUE(at::allclose(y.to(at::kFloat), expected_decode(x).to(at::kFloat), 1e-3, 1e-3));
}

TEST(SignCompressor, RejectsAnotherCodecsPayload) {
  SignCompressor c;
  Payload other = parse_compressor("topk(0.5)")->encode(at::randn({2, 4}), {});
  EXPECT_THROW(c.decode(other, {}), c10::Error);
}

// A two-layer network with a compression boundary between its layers, sign forward and backward,
// learns a linearly separable problem: the boundary really sends what the next stage needs.
TEST(SignCompressor, TrainsThroughABoundary) {
  register_sign_compressor();  // the spec name "sign" (SignCompressor's constructor does it too)
  at::manual_seed(0);
  at::Tensor x = at::randn({512, 20});                 // (N, 20)
  at::Tensor w_true = at::randn({20});
  at::Tensor y = x.matmul(w_true).gt(0).to(at::kLong);  // (N) labels in {0, 1}

  auto gen = at::detail::createCPUGenerator(0);
  auto fc1 = std::make_shared<Linear>(20, 64, true, gen), fc2 = std::make_shared<Linear>(64, 2, true, gen);
  auto cut = std::make_shared<Boundary>("cut", "sign", "sign");  // parses the spec "sign" both ways
  std::vector<Variable> params = fc1->parameters();
  for (const auto& p : fc2->parameters()) params.push_back(p);

  for (int step = 0; step < 300; ++step) {
    Variable h = cut->forward(fc1->forward(Variable(x)));  // the boundary sits before the ReLU
    Variable loss = cross_entropy(fc2->forward(relu(h)), y);
    loss.backward();
    NoGradGuard no_grad;
    for (auto& p : params) {
      p.mutable_data().sub_(0.1 * p.grad());
      p.zero_grad();
    }
  }
  NoGradGuard no_grad;
  at::Tensor logits = fc2->forward(relu(cut->forward(fc1->forward(Variable(x))))).data();
  const double acc = logits.argmax(1).eq(y).to(at::kFloat).mean().item<double>();
  EXPECT_GT(acc, 0.9) << "training accuracy through the sign boundary";
  const auto stats = cut->stats();
  // Per (512, 64) message: 131072 fp32 bytes against a 32-byte header, 512 x 4 bytes of scales
  // and 512 x 64 / 8 bytes of signs = 6176 bytes, 21.2x smaller.
  EXPECT_NEAR(stats.forward.raw_bytes / double(stats.forward.bytes), 131072.0 / 6176.0, 0.01);
}

}  // namespace
}  // namespace tl::lab2
