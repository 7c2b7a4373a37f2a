#pragma once
// BERT's WordPiece tokenizer (as Hugging Face's BertTokenizer / `tokenizers` BertWordPiece does
// it), for feeding real text to BERT checkpoints such as all-MiniLM-L6-v2.
//
//   1. normalisation, character by character:
//      - clean: U+0000, U+FFFD and control/format/private-use characters (categories Cc, Cf, Co,
//        except \t \n \r) are dropped; whitespace (\t \n \r, Zs, U+2028/9) becomes ' ';
//      - CJK ideographs (the ranges of BERT's _is_chinese_char) get a space on each side, so each
//        is its own word;
//      - when lower-casing (uncased models): accents are stripped (canonical decomposition, then
//        non-spacing marks, category Mn, are dropped) and the text is lower-cased.
//   2. pre-tokenisation: split on whitespace; every punctuation character (ASCII !"#$%&'()*+,-./
//      :;<=>?@[\]^_`{|}~ and Unicode categories P*) is a word of its own.
//   3. WordPiece: greedy longest-match-first against the vocabulary, continuation pieces prefixed
//      "##"; a word that cannot be segmented, or longer than 100 characters, becomes [UNK].
//
// Note [WordPiece Unicode coverage]: the category tables (P*, Mn, Cc/Cf/Co, lower-case mappings)
// are complete for Unicode 14 (generated from Python 3.11's unicodedata; the script is in
// wordpiece.cpp). The decomposition used for accent stripping covers the blocks U+00C0-U+04FF
// (Latin-1 Supplement, Latin Extended-A/B, IPA, Greek, Cyrillic), U+1E00-U+1FFF (Latin Extended
// Additional, Greek Extended), U+2000-U+22FF (symbols such as U+2260 -> '='), U+3000-U+30FF
// (kana with voicing marks) and Hangul syllables (algorithmic, into conjoining jamo). Not covered,
// where Hugging Face differs: other canonical decompositions (two-part Indic vowel signs, CJK
// compatibility ideographs U+F900-U+FAFF, ...), unassigned code points (category Cn, which Hugging
// Face drops; here they usually become [UNK]). Lower-casing is per character (no final-sigma
// rule), like `tokenizers`. Invalid UTF-8 bytes decode to U+FFFD and are dropped. Special-token
// strings in the text ("[SEP]") are tokenised as plain text.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace tl {

/// A padded batch of token ids.
struct EncodedBatch {
  at::Tensor ids;             // (B, T) int64, [CLS] ... [SEP] then [PAD]
  at::Tensor attention_mask;  // (B, T) int64, 1 = token, 0 = padding
};

class WordPieceTokenizer {
 public:
  /// vocab.txt: one token per line, the id is the line number (0-based). `lowercase`: uncased
  /// model (lower-case and strip accents, BERT's do_lower_case with strip_accents unset).
  explicit WordPieceTokenizer(const std::string& vocab_path, bool lowercase = true);

  /// Token ids of `text`, wrapped in [CLS] ... [SEP] when add_special_tokens.
  std::vector<int64_t> encode(const std::string& text, bool add_special_tokens = true) const;
  /// The pieces (strings) of `text`, without special tokens.
  std::vector<std::string> tokenize(const std::string& text) const;
  /// Steps 1-2 only: the words (UTF-8) WordPiece then segments.
  std::vector<std::string> basic_tokenize(const std::string& text) const;

  /// Encodes each text as [CLS] pieces [SEP], truncating the pieces so that a row holds at most
  /// max_length ids (>= 2; [CLS] and [SEP] are kept), and pads with [PAD] to the longest row, or
  /// to max_length when pad_to_max. Needs a [PAD] token in the vocabulary.
  EncodedBatch encode_batch(const std::vector<std::string>& texts, int64_t max_length, bool pad_to_max = false) const;

  /// Id of a token; error naming it when absent.
  int64_t id(const std::string& token) const;
  /// The token of an id; error when out of range.
  const std::string& token(int64_t id) const;
  size_t vocab_size() const { return tokens_.size(); }
  int64_t cls_id() const { return cls_; }
  int64_t sep_id() const { return sep_; }
  int64_t unk_id() const { return unk_; }
  /// -1 when the vocabulary has no [PAD].
  int64_t pad_id() const { return pad_; }
  bool lowercase() const { return lowercase_; }

 private:
  std::u32string normalize(const std::string& text) const;
  void wordpiece(const std::u32string& word, std::vector<std::string>& out) const;

  std::string vocab_path_;
  std::unordered_map<std::string, int64_t> vocab_;
  std::vector<std::string> tokens_;
  bool lowercase_;
  int64_t cls_ = -1, sep_ = -1, unk_ = -1, pad_ = -1;
};

}  // namespace tl
