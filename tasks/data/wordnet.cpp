#include "tasks/data/wordnet.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>
#include <unordered_set>

namespace tl {
namespace {

namespace fs = std::filesystem;

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

constexpr uint64_t kSplitSalt = 0x746170656c696e65ull;  // "tapeline"

uint64_t split_hash(char pos, int64_t offset) {
  const uint64_t key = (static_cast<uint64_t>(static_cast<unsigned char>(pos)) << 32) | static_cast<uint64_t>(offset);
  return splitmix64(key ^ kSplitSalt);
}

const char* pos_name(char pos) {
  switch (pos) {
    case 'n':
      return "noun";
    case 'v':
      return "verb";
    case 'a':
      return "adj";
    case 'r':
      return "adv";
    default:
      return "?";
  }
}

/// Whether lex_filenum `f` belongs to the data file of `pos` (lexnames(5WN)).
bool lexfile_fits(char pos, int64_t f) {
  switch (pos) {
    case 'n':
      return f >= 3 && f <= 28;
    case 'v':
      return f >= 29 && f <= 43;
    case 'a':
      return f == 0 || f == 1 || f == 44;
    case 'r':
      return f == 2;
    default:
      return false;
  }
}

const char* lexfile_range(char pos) {
  switch (pos) {
    case 'n':
      return "03..28";
    case 'v':
      return "29..43";
    case 'a':
      return "00, 01 or 44";
    case 'r':
      return "02";
    default:
      return "?";
  }
}

bool all_of(const std::string& s, int (*pred)(int)) {
  return !s.empty() &&
         std::all_of(s.begin(), s.end(), [&](char c) { return pred(static_cast<unsigned char>(c)) != 0; });
}

/// Reads the fields of one record and reports where it breaks.
struct RecordParser {
  const std::string& path;
  int64_t line_no;
  std::vector<std::string> fields;
  size_t next = 0;

  [[noreturn]] void fail(const std::string& what) const {
    TORCH_CHECK(false, "WordNet: ", path, " line ", line_no, ": ", what,
                " (a truncated or corrupt data file? reinstall wordnet-base)");
  }
  const std::string& take(const char* what) {
    if (next >= fields.size()) fail(std::string("record ends where ") + what + " was expected");
    return fields[next++];
  }
  /// A field of exactly `digits` characters (0 = any length) in base 10 or 16.
  int64_t number(const char* what, size_t digits, int base) {
    const std::string& f = take(what);
    const bool ok = (digits == 0 || f.size() == digits) && all_of(f, base == 16 ? ::isxdigit : ::isdigit);
    if (!ok)
      fail(std::string("expected ") + what + " (" + (digits ? std::to_string(digits) + " " : "") +
           (base == 16 ? "hexadecimal" : "decimal") + " digits), got '" + f + "'");
    return std::stoll(f, nullptr, base);
  }
};

std::string strip_adjective_marker(std::string word) {
  // Adjectives may carry a syntactic marker: word(a), word(p), word(ip).
  for (const char* m : {"(a)", "(p)", "(ip)"}) {
    const size_t n = std::char_traits<char>::length(m);
    if (word.size() > n && word.compare(word.size() - n, n, m) == 0) return word.substr(0, word.size() - n);
  }
  return word;
}

WordNetSynset parse_record(const std::string& line, const std::string& path, int64_t line_no, char pos) {
  RecordParser p{path, line_no, {}};
  const size_t bar = line.find(" | ");
  const size_t bar_end =
      line.size() >= 2 && line.compare(line.size() - 2, 2, " |") == 0 ? line.size() - 2 : std::string::npos;
  const size_t cut = bar != std::string::npos ? bar : bar_end;
  if (cut == std::string::npos) p.fail("no ' | ' separating the record from its gloss");
  {
    std::istringstream in(line.substr(0, cut));
    std::string f;
    while (in >> f) p.fields.push_back(f);
  }
  WordNetSynset s;
  s.pos = pos;
  s.offset = p.number("synset_offset", 8, 10);
  s.lexfile = p.number("lex_filenum", 2, 10);
  if (!lexfile_fits(pos, s.lexfile))
    p.fail("lex_filenum " + std::to_string(s.lexfile) + " is not a " + pos_name(pos) + " lexicographer file (" +
           lexfile_range(pos) + " in lexnames(5WN))");
  const std::string& type = p.take("ss_type");
  const std::string allowed = pos == 'a' ? "as" : std::string(1, pos);
  if (type.size() != 1 || allowed.find(type[0]) == std::string::npos)
    p.fail("expected ss_type " + std::string(pos == 'a' ? "'a' or 's'" : "'" + allowed + "'") + " in data." +
           pos_name(pos) + ", got '" + type + "'");
  s.ss_type = type[0];
  const int64_t w_cnt = p.number("w_cnt", 2, 16);
  if (w_cnt < 1) p.fail("w_cnt is 0: a synset has at least one word");
  for (int64_t i = 0; i < w_cnt; ++i) {
    const std::string& word = p.take("a word");
    if (i == 0) {
      s.lemma = strip_adjective_marker(word);
      std::replace(s.lemma.begin(), s.lemma.end(), '_', ' ');
    }
    p.number("lex_id", 1, 16);
  }
  const int64_t p_cnt = p.number("p_cnt", 3, 10);
  for (int64_t i = 0; i < p_cnt; ++i) {
    p.take("a pointer_symbol");
    p.number("a pointer's synset_offset", 8, 10);
    const std::string& ppos = p.take("a pointer's pos");
    if (ppos.size() != 1 || std::string("nvasr").find(ppos[0]) == std::string::npos)
      p.fail("expected a pointer's pos (n, v, a, s or r), got '" + ppos + "'");
    p.number("a pointer's source/target", 4, 16);
  }
  if (pos == 'v') {
    const int64_t f_cnt = p.number("f_cnt (verb frames)", 2, 10);
    for (int64_t i = 0; i < f_cnt; ++i) {
      if (p.take("'+' of a verb frame") != "+")
        p.fail("expected '+' starting a verb frame, got '" + p.fields[p.next - 1] + "'");
      p.number("f_num", 2, 10);
      p.number("w_num", 2, 16);
    }
  }
  if (p.next != p.fields.size())
    p.fail("unexpected field '" + p.fields[p.next] + "' after the pointers" + (pos == 'v' ? " and frames" : "") +
           " (w_cnt or p_cnt wrong?)");
  s.gloss = cut + 3 <= line.size() ? line.substr(cut + 3) : "";
  while (!s.gloss.empty() && (s.gloss.back() == ' ' || s.gloss.back() == '\r')) s.gloss.pop_back();
  if (s.gloss.empty()) p.fail("empty gloss after '|'");
  return s;
}

std::string resolve_root(const std::string& root) { return root.empty() ? default_wordnet_root() : root; }

void check_fraction(double test_fraction) {
  TORCH_CHECK(test_fraction >= 0.0 && test_fraction <= 1.0, "WordNet: test_fraction must be in [0, 1], got ",
              test_fraction);
}

/// Train and test synsets (indices into `all`), each in its fixed pseudo-random order.
std::pair<std::vector<size_t>, std::vector<size_t>> split_indices(const std::vector<WordNetSynset>& all,
                                                                  double test_fraction) {
  std::vector<uint64_t> order_key(all.size());
  std::vector<size_t> train, test;
  for (size_t i = 0; i < all.size(); ++i) {
    const uint64_t h = split_hash(all[i].pos, all[i].offset);
    order_key[i] = splitmix64(h);
    (wordnet_in_test(all[i].pos, all[i].offset, test_fraction) ? test : train).push_back(i);
  }
  const auto by_key = [&](size_t a, size_t b) { return order_key[a] < order_key[b]; };
  std::sort(train.begin(), train.end(), by_key);
  std::sort(test.begin(), test.end(), by_key);
  return {std::move(train), std::move(test)};
}

}  // namespace

TextExamples TextExamples::head(int64_t n) const {
  if (n <= 0 || n >= static_cast<int64_t>(size())) return *this;
  TextExamples out;
  out.texts.assign(texts.begin(), texts.begin() + n);
  out.labels.assign(labels.begin(), labels.begin() + n);
  out.label_names = label_names;
  out.description = description + ", first " + std::to_string(n);
  return out;
}

std::vector<int64_t> TextExamples::label_counts() const {
  std::vector<int64_t> counts(label_names.size(), 0);
  for (int64_t l : labels) {
    TORCH_CHECK(l >= 0 && l < num_classes(), "TextExamples (", description, "): label ", l, " outside [0, ",
                num_classes(), ")");
    ++counts[l];
  }
  return counts;
}

const std::vector<std::string>& wordnet_supersense_names() {
  static const std::vector<std::string> names = {"adj.all",          "adj.pert",           "adv.all",
                                                 "noun.Tops",        "noun.act",           "noun.animal",
                                                 "noun.artifact",    "noun.attribute",     "noun.body",
                                                 "noun.cognition",   "noun.communication", "noun.event",
                                                 "noun.feeling",     "noun.food",          "noun.group",
                                                 "noun.location",    "noun.motive",        "noun.object",
                                                 "noun.person",      "noun.phenomenon",    "noun.plant",
                                                 "noun.possession",  "noun.process",       "noun.quantity",
                                                 "noun.relation",    "noun.shape",         "noun.state",
                                                 "noun.substance",   "noun.time",          "verb.body",
                                                 "verb.change",      "verb.cognition",     "verb.communication",
                                                 "verb.competition", "verb.consumption",   "verb.contact",
                                                 "verb.creation",    "verb.emotion",       "verb.motion",
                                                 "verb.perception",  "verb.possession",    "verb.social",
                                                 "verb.stative",     "verb.weather",       "adj.ppl"};
  return names;
}

std::string default_wordnet_root() { return "/usr/share/wordnet"; }

std::vector<WordNetSynset> read_wordnet_data_file(const std::string& path, char pos) {
  TORCH_CHECK(std::string("nvar").find(pos) != std::string::npos && pos != '\0',
              "read_wordnet_data_file: pos must be 'n', 'v', 'a' or 'r', got '", pos, "'");
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK(in, "WordNet: cannot open ", path,
              " (install Debian's WordNet 3.0 database: apt-get install wordnet-base, or point data.root at a "
              "directory holding data.noun, data.verb, data.adj and data.adv)");
  std::vector<WordNetSynset> out;
  std::unordered_set<int64_t> seen;
  std::string line;
  for (int64_t line_no = 1; std::getline(in, line); ++line_no) {
    if (line.rfind("  ", 0) == 0) continue;  // license header
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    WordNetSynset s = parse_record(line, path, line_no, pos);
    TORCH_CHECK(seen.insert(s.offset).second, "WordNet: ", path, " line ", line_no, ": synset_offset ", s.offset,
                " appears twice");
    out.push_back(std::move(s));
  }
  TORCH_CHECK(!out.empty(), "WordNet: ", path, " holds no synset records");
  return out;
}

std::vector<WordNetSynset> read_wordnet(const std::string& root) {
  const std::string dir = resolve_root(root);
  std::vector<WordNetSynset> all;
  for (char pos : {'n', 'v', 'a', 'r'}) {
    auto part = read_wordnet_data_file((fs::path(dir) / (std::string("data.") + pos_name(pos))).string(), pos);
    all.insert(all.end(), std::make_move_iterator(part.begin()), std::make_move_iterator(part.end()));
  }
  return all;
}

bool wordnet_in_test(char pos, int64_t offset, double test_fraction) {
  const double u = static_cast<double>(split_hash(pos, offset) >> 11) * 0x1.0p-53;  // uniform in [0, 1)
  return u < test_fraction;
}

std::string wordnet_text(const WordNetSynset& synset, const WordNetTextOptions& options) {
  std::string gloss = synset.gloss;
  if (!options.include_examples) {
    // Examples are the '; '-separated parts that start with a double quote.
    std::string kept;
    size_t start = 0;
    while (start <= gloss.size()) {
      size_t end = gloss.find("; ", start);
      if (end == std::string::npos) end = gloss.size();
      const std::string part = gloss.substr(start, end - start);
      if (!part.empty() && part[0] != '"') kept += (kept.empty() ? "" : "; ") + part;
      start = end + 2;
    }
    if (!kept.empty()) gloss = kept;  // a gloss that is only an example stays as it is
  }
  return options.include_lemma ? synset.lemma + ": " + gloss : gloss;
}

TextSplits wordnet_supersenses(const std::string& root, double test_fraction, const WordNetTextOptions& options) {
  check_fraction(test_fraction);
  const std::string dir = resolve_root(root);
  const std::vector<WordNetSynset> all = read_wordnet(dir);
  auto [train_idx, test_idx] = split_indices(all, test_fraction);
  const auto make = [&](const std::vector<size_t>& idx, const char* name) {
    TextExamples ex;
    ex.label_names = wordnet_supersense_names();
    ex.texts.reserve(idx.size());
    ex.labels.reserve(idx.size());
    for (size_t i : idx) {
      ex.texts.push_back(wordnet_text(all[i], options));
      ex.labels.push_back(all[i].lexfile);
    }
    std::ostringstream d;
    d << "wordnet supersenses " << name << " (" << dir << ", test_fraction " << test_fraction << ", text "
      << (options.include_lemma ? "'lemma: gloss'" : "'gloss'") << (options.include_examples ? "" : " without examples")
      << ")";
    ex.description = d.str();
    return ex;
  };
  return {make(train_idx, "train"), make(test_idx, "test")};
}

TextCorpus wordnet_gloss_corpus(const std::string& root, double test_fraction, const WordNetTextOptions& options) {
  check_fraction(test_fraction);
  const std::string dir = resolve_root(root);
  const std::vector<WordNetSynset> all = read_wordnet(dir);
  auto [train_idx, test_idx] = split_indices(all, test_fraction);
  TextCorpus c;
  for (size_t i : train_idx) c.train += wordnet_text(all[i], options) + '\n';
  for (size_t i : test_idx) c.test += wordnet_text(all[i], options) + '\n';
  std::ostringstream d;
  d << "wordnet gloss corpus (" << dir << ", test_fraction " << test_fraction << "): " << train_idx.size() << " / "
    << test_idx.size() << " lines, " << c.train.size() << " / " << c.test.size() << " bytes (train / test)";
  c.description = d.str();
  return c;
}

}  // namespace tl
