// The WordNet reader: record parsing and validation on files the test writes (valid and corrupt),
// and, when Debian's wordnet-base is installed, the real database: counts, the split rule, label
// distribution, the corpus.
#include "tasks/data/wordnet.h"
#include "tests/common/testing.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

namespace tl {
namespace {
namespace fs = std::filesystem;

using testing::error_of;

#define EXPECT_ERROR_HAS(stmt, ...)                                                           \
  do {                                                                                        \
    const std::string err_ = error_of([&] { stmt; });                                         \
    EXPECT_FALSE(err_.empty()) << #stmt << " did not fail";                                   \
    for (const std::string& part_ : std::vector<std::string>{__VA_ARGS__})                    \
      EXPECT_NE(err_.find(part_), std::string::npos) << "'" << part_ << "' not in: " << err_; \
  } while (0)

// Records copied from WordNet 3.0 (with the two-space license header lines the real files have).
const char* kHeader =
    "  1 This software and database is being provided to you, the LICENSEE, by  \n"
    "  2 Princeton University under the following license.  \n";
const char* kNoun =
    "00001740 03 n 01 entity 0 003 ~ 00001930 n 0000 ~ 00002137 n 0000 ~ 04424418 n 0000 | that which is "
    "perceived or known or inferred to have its own distinct existence (living or nonliving)  \n"
    "00015388 05 n 03 animal 0 animate_being 0 beast 0 001 @ 00004475 n 0000 | a living organism characterized by "
    "voluntary movement  \n";
const char* kVerb =
    "00002724 29 v 01 choke 0 002 @ 00001740 v 0000 + 14058252 n 0101 01 + 02 00 | breathe with great difficulty, "
    "as when experiencing a strong emotion; \"She choked with emotion when she spoke about her deceased husband\"  \n";
const char* kAdj =
    "00002098 00 a 01 unable 0 002 = 05200169 n 0000 ! 00001740 a 0101 | (usually followed by `to') not having the "
    "necessary means or skill or know-how; \"unable to get to town without a car\"; \"unable to obtain funds\"  \n"
    "00024619 00 s 02 used_to(p) 0 wont_to(p) 0 001 & 00024417 a 0000 | in the habit; \"I am used to "
    "hitchhiking\"  \n";
const char* kAdv =
    "00001740 02 r 01 a_cappella 0 000 | without musical accompaniment; \"they performed a cappella\"  \n";

struct WordNetDir {
  fs::path dir;
  WordNetDir() {
    dir = fs::temp_directory_path() / ("tl_wordnet_test_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    write("noun", std::string(kHeader) + kNoun);
    write("verb", std::string(kHeader) + kVerb);
    write("adj", std::string(kHeader) + kAdj);
    write("adv", std::string(kHeader) + kAdv);
  }
  ~WordNetDir() { fs::remove_all(dir); }
  std::string write(const std::string& pos, const std::string& text) const {
    const std::string p = (dir / ("data." + pos)).string();
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }
  std::string root() const { return dir.string(); }
};

TEST(WordNetReader, ParsesRecordsOfEveryPartOfSpeech) {
  WordNetDir d;
  const auto all = read_wordnet(d.root());
  ASSERT_EQ(all.size(), 6u);
  EXPECT_EQ(all[0].pos, 'n');
  EXPECT_EQ(all[0].offset, 1740);
  EXPECT_EQ(all[0].lexfile, 3);
  EXPECT_EQ(all[0].lemma, "entity");
  EXPECT_EQ(all[0].gloss,
            "that which is perceived or known or inferred to have its own distinct existence (living or nonliving)");
  EXPECT_EQ(all[1].lemma, "animal");
  EXPECT_EQ(wordnet_supersense_names()[all[1].lexfile], "noun.animal");
  EXPECT_EQ(all[2].pos, 'v');
  EXPECT_EQ(all[2].lexfile, 29);
  EXPECT_EQ(all[3].ss_type, 'a');
  EXPECT_EQ(all[4].ss_type, 's');
  EXPECT_EQ(all[4].pos, 'a');
  EXPECT_EQ(all[4].lemma, "used to");  // marker "(p)" removed, '_' as ' '
  EXPECT_EQ(all[5].pos, 'r');
  EXPECT_EQ(all[5].lemma, "a cappella");
  EXPECT_EQ(all[5].lexfile, 2);

  EXPECT_EQ(wordnet_text(all[2]), all[2].lemma + ": " + all[2].gloss);
  EXPECT_EQ(wordnet_text(all[2], {/*include_lemma=*/false, /*include_examples=*/true}), all[2].gloss);
  EXPECT_EQ(wordnet_text(all[2], {true, /*include_examples=*/false}),
            "choke: breathe with great difficulty, as when experiencing a strong emotion");
  EXPECT_EQ(wordnet_text(all[3], {false, false}),
            "(usually followed by `to') not having the necessary means or skill or know-how");
}

TEST(WordNetReader, RejectsCorruptFilesNamingFileAndLine) {
  WordNetDir d;
  const std::string rec = "00001740 03 n 01 entity 0 001 ~ 00001930 n 0000 | a gloss\n";
  const auto noun = [&](const std::string& body) { return d.write("noun", std::string(kHeader) + body); };
  // Line 3: the first record after the two header lines.
  std::string p = noun("00001740 03 n 01 entity 0 003 ~ 00001930 n 0000 ~ 00002137 n");  // truncated mid-pointer
  EXPECT_ERROR_HAS(read_wordnet_data_file(p, 'n'), p, "line 3", "no ' | '");
  p = noun("00001740 03 n 01 entity 0 003 ~ 00001930 n 0000 ~ 00002137 n | cut short\n");  // truncated, '|' kept
  EXPECT_ERROR_HAS(read_wordnet_data_file(p, 'n'), p, "line 3", "source/target");
  p = noun(rec + "00001930 77 n 01 thing 0 000 | x\n");  // lex_filenum out of range
  EXPECT_ERROR_HAS(read_wordnet_data_file(p, 'n'), p, "line 4", "lex_filenum 77", "03..28");
  p = noun("00001930 29 n 01 thing 0 000 | x\n");  // a verb file number in the noun file
  EXPECT_ERROR_HAS(read_wordnet_data_file(p, 'n'), "line 3", "lex_filenum 29 is not a noun");
  p = noun("00001930 3 n 01 thing 0 000 | x\n");  // one digit
  EXPECT_ERROR_HAS(read_wordnet_data_file(p, 'n'), "line 3", "lex_filenum (2 decimal digits)", "'3'");
  p = noun("00001740 03 n 01 entity 0 001 ~ 00001930 n 0000 a gloss without bar\n");
  EXPECT_ERROR_HAS(read_wordnet_data_file(p, 'n'), p, "line 3", "' | '");
  p = noun("00001740 03 v 01 entity 0 000 | x\n");  // ss_type of another file
  EXPECT_ERROR_HAS(read_wordnet_data_file(p, 'n'), "line 3", "ss_type 'n'", "got 'v'");
  p = noun("00001740 03 n 0g entity 0 000 | x\n");  // w_cnt not hexadecimal
  EXPECT_ERROR_HAS(read_wordnet_data_file(p, 'n'), "line 3", "w_cnt", "'0g'");
  p = noun("00001740 03 n 02 entity 0 000 | x\n");  // w_cnt says two words, one given
  EXPECT_ERROR_HAS(read_wordnet_data_file(p, 'n'), "line 3");
  p = noun("00001740 03 n 01 entity 0 000 extra | x\n");  // a field after the pointers
  EXPECT_ERROR_HAS(read_wordnet_data_file(p, 'n'), "line 3", "unexpected field 'extra'");
  p = noun(rec + rec);  // the same synset twice
  EXPECT_ERROR_HAS(read_wordnet_data_file(p, 'n'), "line 4", "appears twice");
  p = noun("00001740 03 n 01 entity 0 000 | \n");
  EXPECT_ERROR_HAS(read_wordnet_data_file(p, 'n'), "line 3", "empty gloss");
  p = noun("");  // header only
  EXPECT_ERROR_HAS(read_wordnet_data_file(p, 'n'), p, "no synset records");
  p = d.write("verb", std::string(kHeader) + "00002724 29 v 01 choke 0 000 01 * 02 00 | x\n");  // bad frame
  EXPECT_ERROR_HAS(read_wordnet_data_file(p, 'v'), "line 3", "'+' starting a verb frame");
  p = d.write("verb", std::string(kHeader) + "00002724 29 v 01 choke 0 000 | x\n");  // frames missing
  EXPECT_ERROR_HAS(read_wordnet_data_file(p, 'v'), "line 3", "f_cnt");

  // A missing file is named, with the package that provides it.
  d.write("noun", std::string(kHeader) + kNoun);
  d.write("verb", std::string(kHeader) + kVerb);
  ASSERT_EQ(read_wordnet(d.root()).size(), 6u);
  fs::remove(d.dir / "data.adv");
  EXPECT_ERROR_HAS(read_wordnet(d.root()), (d.dir / "data.adv").string(), "apt-get install wordnet-base");
  EXPECT_ERROR_HAS(wordnet_supersenses(d.root(), 1.5), "test_fraction must be in [0, 1]");
}

TEST(WordNetReader, SplitRuleIsFixedAndNested) {
  // The rule depends only on (pos, offset, fraction): a few fixed values, then nesting.
  int64_t in_test = 0;
  for (int64_t off = 0; off < 20000; ++off) {
    const bool small = wordnet_in_test('n', off, 0.05), large = wordnet_in_test('n', off, 0.1);
    EXPECT_TRUE(!small || large) << off;
    in_test += large;
    EXPECT_FALSE(wordnet_in_test('v', off, 0.0));
    EXPECT_TRUE(wordnet_in_test('v', off, 1.0));
  }
  EXPECT_NEAR(in_test / 20000.0, 0.1, 0.01);
  // 'n' and 'v' synsets with the same offset are split independently.
  int64_t differ = 0;
  for (int64_t off = 0; off < 2000; ++off) differ += wordnet_in_test('n', off, 0.5) != wordnet_in_test('v', off, 0.5);
  EXPECT_GT(differ, 800);
}

// ---- the real database ---------------------------------------------------------------------------
bool wordnet_installed() { return fs::exists(default_wordnet_root() + "/data.noun"); }

TEST(WordNetReal, ReadsAllSynsetsOfWordNet30) {
  if (!wordnet_installed())
    GTEST_SKIP() << default_wordnet_root() << "/data.noun absent (apt-get install wordnet-base)";
  const auto all = read_wordnet("");
  std::map<char, int64_t> per_pos;
  for (const auto& s : all) ++per_pos[s.pos];
  EXPECT_EQ(per_pos['n'], 82115);
  EXPECT_EQ(per_pos['v'], 13767);
  EXPECT_EQ(per_pos['a'], 18156);
  EXPECT_EQ(per_pos['r'], 3621);
  EXPECT_EQ(all.front().lemma, "entity");
  for (const auto& s : all) {
    ASSERT_FALSE(s.gloss.empty()) << s.offset;
    ASSERT_FALSE(s.lemma.empty()) << s.offset;
    ASSERT_EQ(s.lemma.find('('), std::string::npos) << "adjective marker left in '" << s.lemma << "'";
  }
}

TEST(WordNetReal, SupersenseSplitsAreDeterministicDisjointAndBalancedEnough) {
  if (!wordnet_installed())
    GTEST_SKIP() << default_wordnet_root() << "/data.noun absent (apt-get install wordnet-base)";
  const TextSplits a = wordnet_supersenses("", 0.1);
  const TextSplits b = wordnet_supersenses("", 0.1);
  EXPECT_EQ(a.train.texts, b.train.texts);
  EXPECT_EQ(a.train.labels, b.train.labels);
  EXPECT_EQ(a.test.texts, b.test.texts);
  const size_t total = a.train.size() + a.test.size();
  EXPECT_EQ(total, 117659u);
  EXPECT_NEAR(static_cast<double>(a.test.size()) / total, 0.1, 0.005);
  ASSERT_EQ(a.train.labels.size(), a.train.texts.size());
  ASSERT_EQ(a.train.num_classes(), 45);
  EXPECT_EQ(a.train.label_names[5], "noun.animal");
  EXPECT_EQ(a.train.label_names[38], "verb.motion");

  // Disjoint: every synset is in exactly the split the rule says (texts can repeat across
  // synsets, so membership is checked on the synsets themselves).
  const auto all = read_wordnet("");
  std::multiset<std::string> train_texts(a.train.texts.begin(), a.train.texts.end());
  std::multiset<std::string> test_texts(a.test.texts.begin(), a.test.texts.end());
  int64_t n_test = 0;
  for (const auto& s : all) {
    const bool t = wordnet_in_test(s.pos, s.offset, 0.1);
    n_test += t;
    auto& bag = t ? test_texts : train_texts;
    auto it = bag.find(wordnet_text(s));
    ASSERT_NE(it, bag.end()) << "synset " << s.pos << s.offset << " missing from its split";
    bag.erase(it);
  }
  EXPECT_TRUE(train_texts.empty() && test_texts.empty());
  EXPECT_EQ(n_test, static_cast<int64_t>(a.test.size()));

  // Labels: every supersense in train, nearly all in test, no class dominating.
  const auto train_counts = a.train.label_counts(), test_counts = a.test.label_counts();
  int64_t present_test = 0, majority = 0;
  for (int64_t c = 0; c < 45; ++c) {
    EXPECT_GT(train_counts[c], 0) << a.train.label_names[c];
    present_test += test_counts[c] > 0;
    majority = std::max(majority, test_counts[c]);
  }
  EXPECT_GE(present_test, 40);
  const double majority_share = static_cast<double>(majority) / a.test.size();
  EXPECT_LT(majority_share, 0.15);
  std::printf("[ INFO     ] wordnet: %zu train / %zu test, majority class %.1f%% of test, %lld classes in test\n",
              a.train.size(), a.test.size(), 100 * majority_share, static_cast<long long>(present_test));

  // head(n) is a uniform sample: nouns, verbs, adjectives and adverbs all appear in 2000.
  const TextExamples h = a.train.head(2000);
  EXPECT_EQ(h.size(), 2000u);
  std::set<int64_t> classes(h.labels.begin(), h.labels.end());
  EXPECT_GE(classes.size(), 35u);
  EXPECT_TRUE(classes.count(0) && classes.count(2) && classes.count(6) && classes.count(30));
  EXPECT_EQ(a.train.head(0).size(), a.train.size());
}

TEST(WordNetReal, GlossCorpusFollowsTheSameSplit) {
  if (!wordnet_installed())
    GTEST_SKIP() << default_wordnet_root() << "/data.noun absent (apt-get install wordnet-base)";
  const TextSplits s = wordnet_supersenses("", 0.1);
  const TextCorpus c = wordnet_gloss_corpus("", 0.1);
  std::string train;
  for (const auto& t : s.train.texts) train += t + '\n';
  std::string test;
  for (const auto& t : s.test.texts) test += t + '\n';
  EXPECT_TRUE(c.train == train);
  EXPECT_TRUE(c.test == test);
  EXPECT_GT(c.train.size(), 8'000'000u);  // 9.3 MB
  const TextCorpus plain = wordnet_gloss_corpus("", 0.1, {/*include_lemma=*/false, /*include_examples=*/false});
  EXPECT_LT(plain.train.size(), c.train.size() * 3 / 4);
  EXPECT_FALSE(c.description.empty());
}

}  // namespace
}  // namespace tl
