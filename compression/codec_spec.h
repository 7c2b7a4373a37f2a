#pragma once
// CodecSpec: a compressor spec parsed once. It holds the text as written, the parsed calls and
// the registry record of every codec the spec names, so that code deciding where a codec may go
// (data-parallel gradients, tensor-parallel all-reduces) asks the records' traits instead of
// searching the text.

#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "compression/registry.h"
#include "compression/spec.h"

namespace tl {

class CodecSpec {
 public:
  /// "identity".
  CodecSpec();
  /// Parses `text`; a syntax error or a name without a record is an error naming it (arguments
  /// are checked when the codec is built: build()).
  explicit CodecSpec(const std::string& text);

  const std::string& text() const { return text_; }
  const SpecCall& call() const { return *call_; }
  /// The record of the outermost codec (the first stage of a '|' pipeline).
  const CodecRecord& record() const { return *records_.front(); }
  /// The records of every codec in the spec, outermost first: each pipeline stage and every
  /// codec given as a nested spec argument (the C of ef(C), the candidates of schedule(...)).
  /// Note: a codec given as a bare word (ef(identity)) is not a nested spec for the parser (a word
  /// such as values=fp16 looks the same) and is not listed; every codec whose traits refuse a
  /// message takes arguments, so it is never written as a bare word.
  const std::vector<const CodecRecord*>& records() const& { return records_; }
  /// Of a temporary (`for (auto* r : CodecSpec(text).records())`): a copy, not a dangling reference.
  std::vector<const CodecRecord*> records() && { return std::move(records_); }
  /// Whether the spec is `identity` alone: the message goes uncompressed.
  bool is_identity() const { return !call_->next && call_->name == "identity"; }

  /// A new compressor (each call builds its own: a compressor belongs to one message stream).
  CompressorPtr build() const { return build_compressor(*call_); }

  /// A spec is its text as written: config values compare and print as such.
  friend bool operator==(const CodecSpec& a, const std::string& text) { return a.text_ == text; }
  friend bool operator!=(const CodecSpec& a, const std::string& text) { return a.text_ != text; }
  friend std::ostream& operator<<(std::ostream& out, const CodecSpec& s) { return out << s.text_; }

 private:
  std::string text_;
  std::shared_ptr<const SpecCall> call_;
  std::vector<const CodecRecord*> records_;
};

}  // namespace tl
