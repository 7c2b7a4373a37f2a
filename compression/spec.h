#pragma once
// Compressor spec strings (documented in docs/COMPRESSION.md), e.g.
//   topk(0.1)   quant(bits=4, scale=channel, round=stochastic)   ef(topk(0.1))
//   topk(0.1) | quant(4)   powersgd(rank=16)   ae(64)   subspace(k=8)   aqsgd(quant(4))
// A spec is a pipeline of calls joined by '|'; each call has positional and key=value arguments
// whose values are numbers, words or nested specs.

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "compression/compressor.h"
#include "compression/registry.h"  // register_compressor, known_compressors: the codec records

namespace tl {

struct SpecCall;
/// A value: number, bare word, or nested spec.
struct SpecValue {
  std::variant<double, std::string, std::shared_ptr<SpecCall>> v;
  std::string text;  // as written, for error messages
};

struct SpecCall {
  std::string name;
  std::vector<SpecValue> positional;
  std::vector<std::pair<std::string, SpecValue>> named;
  std::shared_ptr<SpecCall> next;  // the stage after '|', if any
  std::string text;                // as written
};

/// Parse; a syntax error names the position and the offending token.
std::shared_ptr<SpecCall> parse_spec(const std::string& text);

/// Argument access for factories: typed, with errors naming the codec, the argument and what is
/// accepted. Every argument must be consumed (unknown arguments are errors).
class SpecArgs {
 public:
  /// Position for arguments that can only be given as key=value.
  static constexpr size_t kNamedOnly = static_cast<size_t>(-1);

  explicit SpecArgs(const SpecCall& call);
  double number(size_t pos, const std::string& key, std::optional<double> fallback = std::nullopt);
  int64_t integer(size_t pos, const std::string& key, std::optional<int64_t> fallback = std::nullopt);
  std::string word(size_t pos, const std::string& key, const std::vector<std::string>& accepted,
                   std::optional<std::string> fallback = std::nullopt);
  /// A nested spec argument (e.g. the inner codec of ef(...)).
  std::shared_ptr<SpecCall> spec(size_t pos, const std::string& key, bool required = true);
  bool has(size_t pos, const std::string& key) const;
  /// The value at `pos` or `key` without consuming it (nullptr if absent), e.g. to tell `dim=auto`
  /// from `dim=2` or a fraction `0.5` from a count `5`.
  const SpecValue* peek(size_t pos, const std::string& key) const;
  /// Bad-argument error: names the codec, the argument, its value as written and `accepted`.
  [[noreturn]] void fail(size_t pos, const std::string& key, const std::string& accepted) const;
  /// Error if any argument was not consumed.
  void done() const;
  const SpecCall& call() const { return call_; }

 private:
  const SpecValue* find(size_t pos, const std::string& key) const;
  void note(size_t pos, const std::string& key) const;
  const SpecCall& call_;
  mutable std::vector<bool> used_pos_, used_named_;
  mutable std::vector<std::pair<size_t, std::string>> asked_;  // what the factory accepts, for errors
};

/// Whether `name` can be a codec's spec name: a letter or '_', then letters, digits, '_', '-', '.'.
bool is_spec_name(const std::string& name);

/// Builds a compressor (a '|' pipeline becomes a composition). Unknown name: error listing the
/// known ones.
CompressorPtr parse_compressor(const std::string& text);
/// One identity codec shared by the callers that only pack or unpack uncompressed payloads (it
/// keeps no state).
const CompressorPtr& identity_compressor();
/// As parse_compressor, but a bad spec returns null and sets `*error` to why.
CompressorPtr try_parse_compressor(const std::string& text, std::string* error);
CompressorPtr build_compressor(const SpecCall& call);
/// The registry record of `call`'s codec (its first stage); an unknown name is an error listing
/// the known ones.
const CodecRecord& record_of(const SpecCall& call);

}  // namespace tl
