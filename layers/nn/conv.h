#pragma once
// 2-D convolution and pooling over (N, C, H, W) inputs.

#include <array>

#include "layers/module.h"
#include "layers/nn/init.h"

namespace tl {

/// Conv2d settings; square kernels/strides/paddings from one int, or (h, w) pairs.
/// Conv2dOptions(3, 64, 3).padding(1).bias(false)
struct Conv2dOptions {
  Conv2dOptions(int64_t in_channels, int64_t out_channels, int64_t kernel)
      : in_channels_(in_channels), out_channels_(out_channels), kernel_{kernel, kernel} {}
  // clang-format off
  Conv2dOptions& kernel(std::array<int64_t, 2> k) { kernel_ = k; return *this; }
  Conv2dOptions& stride(int64_t s) { stride_ = {s, s}; return *this; }
  Conv2dOptions& stride(std::array<int64_t, 2> s) { stride_ = s; return *this; }
  Conv2dOptions& padding(int64_t p) { padding_ = {p, p}; return *this; }
  Conv2dOptions& padding(std::array<int64_t, 2> p) { padding_ = p; return *this; }
  Conv2dOptions& dilation(int64_t d) { dilation_ = {d, d}; return *this; }
  Conv2dOptions& groups(int64_t g) { groups_ = g; return *this; }
  Conv2dOptions& bias(bool b) { bias_ = b; return *this; }
  // clang-format on

  int64_t in_channels_, out_channels_;
  std::array<int64_t, 2> kernel_, stride_{1, 1}, padding_{0, 0}, dilation_{1, 1};
  int64_t groups_ = 1;
  bool bias_ = true;
};

class Conv2d : public Module {
 public:
  /// weight (out, in / groups, kH, kW), bias (out): PyTorch's default initialisation.
  explicit Conv2d(const Conv2dOptions& options, const init::Generator& gen = std::nullopt);
  /// x (N, in, H, W) -> (N, out, H', W')
  Variable forward(const Variable& x) override;

  const Variable& weight() const { return weight_; }
  const Variable& bias() const { return bias_; }
  const Conv2dOptions& options() const { return options_; }

 private:
  Conv2dOptions options_;
  Variable weight_;
  Variable bias_;
};

class MaxPool2d : public Module {
 public:
  /// stride 0 means stride = kernel (PyTorch's default).
  explicit MaxPool2d(int64_t kernel, int64_t stride = 0, int64_t padding = 0);
  Variable forward(const Variable& x) override;  // (N, C, H, W) -> (N, C, H', W')

 private:
  int64_t kernel_, stride_, padding_;
};

class AvgPool2d : public Module {
 public:
  /// stride 0 means stride = kernel. Padding counts in the average (count_include_pad, as PyTorch).
  explicit AvgPool2d(int64_t kernel, int64_t stride = 0, int64_t padding = 0);
  Variable forward(const Variable& x) override;  // (N, C, H, W) -> (N, C, H', W')

 private:
  int64_t kernel_, stride_, padding_;
};

class AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(std::array<int64_t, 2> output_size);
  explicit AdaptiveAvgPool2d(int64_t output_size) : AdaptiveAvgPool2d({output_size, output_size}) {}
  Variable forward(const Variable& x) override;  // (N, C, H, W) -> (N, C, oh, ow)

 private:
  std::array<int64_t, 2> output_size_;
};

}  // namespace tl
