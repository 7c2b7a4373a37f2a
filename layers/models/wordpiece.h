#pragma once
// A minimal BERT WordPiece tokenizer (uncased): enough to feed real text to a Hugging Face BERT
// checkpoint in tests and examples.
//   1. basic tokenization: ASCII lower-casing, split on whitespace, every ASCII punctuation
//      character its own token (non-ASCII bytes are kept inside words; no Unicode
//      normalisation, accent stripping or CJK splitting, unlike the full Hugging Face tokenizer);
//   2. WordPiece: greedy longest-match-first against the vocabulary, continuation pieces
//      prefixed "##"; a word with no segmentation becomes [UNK].

#include <string>
#include <unordered_map>
#include <vector>

namespace tl {

class WordPieceTokenizer {
 public:
  /// vocab.txt: one token per line, the id is the line number (0-based).
  explicit WordPieceTokenizer(const std::string& vocab_path, bool lowercase = true);

  /// Token ids of `text`, wrapped in [CLS] ... [SEP] when add_special_tokens.
  std::vector<int64_t> encode(const std::string& text, bool add_special_tokens = true) const;
  /// The pieces (strings) of `text`, without special tokens.
  std::vector<std::string> tokenize(const std::string& text) const;

  /// Id of a token; error naming it when absent.
  int64_t id(const std::string& token) const;
  size_t vocab_size() const { return vocab_.size(); }

 private:
  std::unordered_map<std::string, int64_t> vocab_;
  bool lowercase_;
};

}  // namespace tl
