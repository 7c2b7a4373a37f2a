#include "compression/spec.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>

#include "compression/codecs/compose.h"

namespace tl {

namespace {

// ---- tokens ---------------------------------------------------------------------------------------
enum class Tok { kName, kNumber, kLParen, kRParen, kComma, kEquals, kPipe, kEnd };

struct Token {
  Tok kind;
  size_t begin, end;  // [begin, end) in the text
};

bool name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.'; }
bool digit(char c) { return std::isdigit(static_cast<unsigned char>(c)); }

constexpr int kMaxDepth = 32;

class Parser {
 public:
  explicit Parser(const std::string& text) : s_(text) { tokenize(); }

  std::shared_ptr<SpecCall> parse() {
    TORCH_CHECK(toks_.size() > 1, "empty compressor spec; expected e.g. 'topk(0.1)' or 'quant(bits=4)'");
    auto call = pipeline(0);
    if (peek().kind != Tok::kEnd) error(peek(), "expected '|' or the end of the spec");
    return call;
  }

 private:
  [[noreturn]] void error_at(size_t pos, size_t len, const std::string& found, const std::string& expected) const {
    std::string caret(pos, ' ');
    caret += std::string(std::max<size_t>(len, 1), '^');
    TORCH_CHECK(false, "bad compressor spec: ", found, " at column ", pos + 1, "; ", expected, "\n  ", s_, "\n  ",
                caret);
  }
  [[noreturn]] void error(const Token& t, const std::string& expected) const {
    const std::string found =
        t.kind == Tok::kEnd ? "unexpected end of the spec" : "unexpected '" + s_.substr(t.begin, t.end - t.begin) + "'";
    error_at(t.begin, t.end - t.begin, found, expected);
  }

  void tokenize() {
    size_t i = 0;
    while (i < s_.size()) {
      const char c = s_[i];
      if (std::isspace(static_cast<unsigned char>(c))) {
        ++i;
        continue;
      }
      const size_t b = i;
      if (name_start(c)) {
        while (i < s_.size() && name_char(s_[i])) ++i;
        toks_.push_back({Tok::kName, b, i});
      } else if (digit(c) || c == '.' ||
                 ((c == '-' || c == '+') && i + 1 < s_.size() && (digit(s_[i + 1]) || s_[i + 1] == '.'))) {
        if (c == '-' || c == '+') ++i;
        while (i < s_.size() && (digit(s_[i]) || s_[i] == '.')) ++i;
        if (i < s_.size() && (s_[i] == 'e' || s_[i] == 'E')) {
          ++i;
          if (i < s_.size() && (s_[i] == '-' || s_[i] == '+')) ++i;
          while (i < s_.size() && digit(s_[i])) ++i;
        }
        while (i < s_.size() && name_char(s_[i])) ++i;  // swallow "4bits" to report it whole
        const std::string text = s_.substr(b, i - b);
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (end != text.c_str() + text.size() || !std::isfinite(v))
          error_at(b, i - b, "malformed number '" + text + "'", "expected a number such as 4, 0.1, -1 or 1e-3");
        toks_.push_back({Tok::kNumber, b, i});
      } else {
        Tok k;
        switch (c) {
          case '(':
            k = Tok::kLParen;
            break;
          case ')':
            k = Tok::kRParen;
            break;
          case ',':
            k = Tok::kComma;
            break;
          case '=':
            k = Tok::kEquals;
            break;
          case '|':
            k = Tok::kPipe;
            break;
          default:
            error_at(b, 1, std::string("unexpected character '") + c + "'",
                     "accepted: names, numbers, '(', ')', ',', '=', '|' and spaces");
        }
        toks_.push_back({k, b, ++i});
      }
    }
    toks_.push_back({Tok::kEnd, s_.size(), s_.size()});
  }

  const Token& peek(size_t ahead = 0) const { return toks_[std::min(t_ + ahead, toks_.size() - 1)]; }
  const Token& next() { return toks_[std::min(t_++, toks_.size() - 1)]; }
  std::string text(size_t b, size_t e) const { return s_.substr(b, e - b); }

  // pipeline := call ('|' call)*
  std::shared_ptr<SpecCall> pipeline(int depth) {
    if (depth > kMaxDepth) error(peek(), "specs nest at most " + std::to_string(kMaxDepth) + " deep");
    auto head = call(depth);
    SpecCall* tail = head.get();
    while (peek().kind == Tok::kPipe) {
      next();
      tail->next = call(depth);
      tail = tail->next.get();
    }
    return head;
  }

  // call := NAME ['(' [arg (',' arg)*] ')']
  std::shared_ptr<SpecCall> call(int depth) {
    const Token& name = next();
    if (name.kind != Tok::kName) error(name, "expected a compressor name such as topk, quant or ef");
    auto c = std::make_shared<SpecCall>();
    c->name = text(name.begin, name.end);
    size_t end = name.end;
    if (peek().kind == Tok::kLParen) {
      next();
      if (peek().kind != Tok::kRParen) {
        while (true) {
          argument(*c, depth);
          const Token& sep = next();
          if (sep.kind == Tok::kRParen) break;
          if (sep.kind != Tok::kComma) error(sep, "expected ',' or ')' after an argument of " + c->name);
        }
        end = toks_[t_ - 1].end;
      } else {
        end = next().end;
      }
    }
    c->text = text(name.begin, end);
    return c;
  }

  // arg := NAME '=' value | value
  void argument(SpecCall& c, int depth) {
    if (peek().kind == Tok::kName && peek(1).kind == Tok::kEquals) {
      const Token key = next();
      next();
      const std::string k = text(key.begin, key.end);
      for (const auto& [existing, _] : c.named)
        if (existing == k) error(key, "argument '" + k + "' of " + c.name + " is given twice");
      c.named.emplace_back(k, value(depth));
    } else {
      if (!c.named.empty())
        error(peek(), "positional arguments must come before key=value arguments in " + c.name + "(...)");
      c.positional.push_back(value(depth));
    }
  }

  // value := NUMBER | pipeline (a lone name is a word)
  SpecValue value(int depth) {
    const Token& t = peek();
    SpecValue v;
    if (t.kind == Tok::kNumber) {
      next();
      v.text = text(t.begin, t.end);
      v.v = std::strtod(v.text.c_str(), nullptr);
      return v;
    }
    if (t.kind != Tok::kName) error(t, "expected an argument value: a number, a word or a compressor spec");
    const size_t begin = t.begin;
    if (peek(1).kind != Tok::kLParen && peek(1).kind != Tok::kPipe) {
      next();
      v.text = text(t.begin, t.end);
      v.v = v.text;
      return v;
    }
    auto nested = pipeline(depth + 1);
    v.text = text(begin, toks_[t_ - 1].end);
    v.v = nested;
    return v;
  }

  const std::string& s_;
  std::vector<Token> toks_;
  size_t t_ = 0;
};

std::string position_text(size_t pos) {
  return pos == SpecArgs::kNamedOnly ? std::string() : " (argument " + std::to_string(pos + 1) + ")";
}

}  // namespace

std::shared_ptr<SpecCall> parse_spec(const std::string& text) { return Parser(text).parse(); }

bool is_spec_name(const std::string& name) {
  return !name.empty() && name_start(name[0]) && std::all_of(name.begin(), name.end(), name_char);
}

// ---- SpecArgs -------------------------------------------------------------------------------------------
SpecArgs::SpecArgs(const SpecCall& call)
    : call_(call), used_pos_(call.positional.size(), false), used_named_(call.named.size(), false) {}

void SpecArgs::note(size_t pos, const std::string& key) const {
  for (const auto& [p, k] : asked_)
    if (k == key) return;
  asked_.emplace_back(pos, key);
}

const SpecValue* SpecArgs::find(size_t pos, const std::string& key) const {
  note(pos, key);
  const SpecValue* by_pos = nullptr;
  if (pos != kNamedOnly && pos < call_.positional.size()) {
    by_pos = &call_.positional[pos];
    used_pos_[pos] = true;
  }
  const SpecValue* by_key = nullptr;
  for (size_t i = 0; i < call_.named.size(); ++i)
    if (call_.named[i].first == key) {
      by_key = &call_.named[i].second;
      used_named_[i] = true;
    }
  TORCH_CHECK(!(by_pos && by_key), call_.name, ": argument '", key, "' is given twice: as '",
              by_pos ? by_pos->text : "", "'", position_text(pos), " and as ", key, "=", by_key ? by_key->text : "",
              " in '", call_.text, "'");
  return by_pos ? by_pos : by_key;
}

const SpecValue* SpecArgs::peek(size_t pos, const std::string& key) const {
  if (pos != kNamedOnly && pos < call_.positional.size()) return &call_.positional[pos];
  for (const auto& [k, v] : call_.named)
    if (k == key) return &v;
  return nullptr;
}

bool SpecArgs::has(size_t pos, const std::string& key) const { return peek(pos, key) != nullptr; }

void SpecArgs::fail(size_t pos, const std::string& key, const std::string& accepted) const {
  const SpecValue* v = peek(pos, key);
  TORCH_CHECK(false, call_.name, ": bad argument ", key, "=", v ? v->text : "(missing)", position_text(pos), " in '",
              call_.text, "'; accepted: ", accepted);
}

double SpecArgs::number(size_t pos, const std::string& key, std::optional<double> fallback) {
  const SpecValue* v = find(pos, key);
  if (!v) {
    TORCH_CHECK(fallback.has_value(), call_.name, ": missing argument '", key, "'", position_text(pos), " in '",
                call_.text, "'");
    return *fallback;
  }
  if (!std::holds_alternative<double>(v->v)) fail(pos, key, "a number");
  return std::get<double>(v->v);
}

int64_t SpecArgs::integer(size_t pos, const std::string& key, std::optional<int64_t> fallback) {
  const bool present = peek(pos, key) != nullptr;
  const double d = number(pos, key, fallback ? std::optional<double>(static_cast<double>(*fallback)) : std::nullopt);
  if (!present) return *fallback;
  if (!(std::floor(d) == d && std::fabs(d) < 9.0e15)) fail(pos, key, "an integer");
  return static_cast<int64_t>(d);
}

std::string SpecArgs::word(size_t pos, const std::string& key, const std::vector<std::string>& accepted,
                           std::optional<std::string> fallback) {
  const SpecValue* v = find(pos, key);
  std::string list;
  for (const auto& a : accepted) list += (list.empty() ? "" : ", ") + a;
  if (!v) {
    TORCH_CHECK(fallback.has_value(), call_.name, ": missing argument '", key, "'", position_text(pos), " in '",
                call_.text, "'; accepted: ", list);
    return *fallback;
  }
  if (!std::holds_alternative<std::string>(v->v)) fail(pos, key, list.empty() ? "a word" : list);
  const std::string& w = std::get<std::string>(v->v);
  if (!accepted.empty() && std::find(accepted.begin(), accepted.end(), w) == accepted.end()) fail(pos, key, list);
  return w;
}

std::shared_ptr<SpecCall> SpecArgs::spec(size_t pos, const std::string& key, bool required) {
  const SpecValue* v = find(pos, key);
  if (!v) {
    TORCH_CHECK(!required, call_.name, ": missing argument '", key, "'", position_text(pos), " in '", call_.text,
                "': a compressor spec such as topk(0.1)");
    return nullptr;
  }
  if (std::holds_alternative<std::shared_ptr<SpecCall>>(v->v)) return std::get<std::shared_ptr<SpecCall>>(v->v);
  if (std::holds_alternative<std::string>(v->v)) {
    auto c = std::make_shared<SpecCall>();
    c->name = c->text = std::get<std::string>(v->v);
    return c;
  }
  fail(pos, key, "a compressor spec such as topk(0.1) or identity");
}

void SpecArgs::done() const {
  std::vector<std::pair<size_t, std::string>> positional;
  std::string accepted;
  for (const auto& [p, k] : asked_) {
    accepted += (accepted.empty() ? "" : ", ") + k;
    if (p != kNamedOnly) positional.emplace_back(p, k);
  }
  std::sort(positional.begin(), positional.end());
  for (size_t i = 0; i < call_.named.size(); ++i)
    TORCH_CHECK(used_named_[i], call_.name, ": unknown argument '", call_.named[i].first, "' in '", call_.text,
                "'; accepted: ", accepted.empty() ? "no arguments" : accepted);
  for (size_t i = 0; i < call_.positional.size(); ++i) {
    if (used_pos_[i]) continue;
    std::string names;
    for (const auto& [p, k] : positional) names += (names.empty() ? "" : ", ") + k;
    TORCH_CHECK(false, call_.name, ": unexpected argument '", call_.positional[i].text, "' (argument ", i + 1, ") in '",
                call_.text, "'; ", call_.name, " takes ", positional.size(), " positional argument",
                positional.size() == 1 ? "" : "s", positional.empty() ? "" : " (" + names + ")",
                accepted.empty() ? "" : "; accepted: " + accepted);
  }
}

// ---- building -------------------------------------------------------------------------------------------
const CodecRecord& record_of(const SpecCall& call) {
  const CodecRecord* record = find_codec(call.name);
  TORCH_CHECK(record && record->factory, "unknown compressor '", call.name, "' in '", call.text,
              "'; known: ", codec_names([](const CodecRecord&) { return true; }));
  return *record;
}

CompressorPtr build_compressor(const SpecCall& call) {
  ensure_builtin_codecs();
  if (call.next) {
    // a | b | c is a | (b | c): each stage's value sections go through the rest of the pipeline.
    // The stages are built in order, and a stage that cannot pass sections on fails before the
    // rest is built (an `ae(..., d=)` there makes its weights when built).
    SpecCall head = call;
    head.next = nullptr;
    CompressorPtr outer = build_compressor(head);
    require_sectioned(outer, call.next->text);
    return make_composition(std::move(outer), build_compressor(*call.next));
  }
  SpecArgs args(call);
  CompressorPtr c = record_of(call).factory(args);
  args.done();
  TORCH_CHECK(c, "compressor factory for '", call.name, "' returned nothing");
  return c;
}

CompressorPtr parse_compressor(const std::string& text) { return build_compressor(*parse_spec(text)); }

const CompressorPtr& identity_compressor() {
  static const CompressorPtr codec = parse_compressor("identity");
  return codec;
}

CompressorPtr try_parse_compressor(const std::string& text, std::string* error) {
  try {
    return parse_compressor(text);
  } catch (const c10::Error& e) {
    *error = e.what_without_backtrace();
    return nullptr;
  }
}

}  // namespace tl
