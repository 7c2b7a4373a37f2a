#include "layers/models/wordpiece.h"

#include <c10/util/Exception.h>

#include <cctype>
#include <fstream>

namespace tl {

WordPieceTokenizer::WordPieceTokenizer(const std::string& vocab_path, bool lowercase) : lowercase_(lowercase) {
  std::ifstream in(vocab_path);
  TORCH_CHECK(in, "WordPieceTokenizer: cannot open vocabulary '", vocab_path, "'");
  std::string line;
  for (int64_t i = 0; std::getline(in, line); ++i) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    vocab_.emplace(line, i);  // the first occurrence wins, as in Hugging Face's loader
  }
  for (const char* special : {"[UNK]", "[CLS]", "[SEP]"})
    TORCH_CHECK(vocab_.count(special), "WordPieceTokenizer: '", vocab_path, "' has no ", special, " token");
}

int64_t WordPieceTokenizer::id(const std::string& token) const {
  auto it = vocab_.find(token);
  TORCH_CHECK(it != vocab_.end(), "WordPieceTokenizer: token '", token, "' is not in the vocabulary");
  return it->second;
}

std::vector<std::string> WordPieceTokenizer::tokenize(const std::string& text) const {
  // 1. basic tokenization into words.
  std::vector<std::string> words;
  std::string cur;
  auto flush = [&] {
    if (!cur.empty()) words.push_back(cur);
    cur.clear();
  };
  for (char ch : text) {
    const unsigned char u = static_cast<unsigned char>(ch);
    if (std::isspace(u)) {
      flush();
    } else if (u < 128 && std::ispunct(u)) {
      flush();
      words.emplace_back(1, ch);
    } else {
      cur += (lowercase_ && u < 128) ? static_cast<char>(std::tolower(u)) : ch;
    }
  }
  flush();

  // 2. greedy longest-match-first WordPiece per word.
  constexpr size_t kMaxWordChars = 100;
  std::vector<std::string> pieces;
  for (const auto& word : words) {
    std::vector<std::string> sub;
    bool bad = word.size() > kMaxWordChars;
    for (size_t start = 0; !bad && start < word.size();) {
      size_t end = word.size();
      std::string found;
      for (; end > start; --end) {
        std::string piece = (start > 0 ? "##" : "") + word.substr(start, end - start);
        if (vocab_.count(piece)) {
          found = piece;
          break;
        }
      }
      if (found.empty())
        bad = true;
      else
        sub.push_back(found);
      start = end;
    }
    if (bad)
      pieces.push_back("[UNK]");
    else
      pieces.insert(pieces.end(), sub.begin(), sub.end());
  }
  return pieces;
}

std::vector<int64_t> WordPieceTokenizer::encode(const std::string& text, bool add_special_tokens) const {
  std::vector<int64_t> ids;
  if (add_special_tokens) ids.push_back(id("[CLS]"));
  for (const auto& p : tokenize(text)) ids.push_back(id(p));
  if (add_special_tokens) ids.push_back(id("[SEP]"));
  return ids;
}

}  // namespace tl
