// safetensors: round trip of every dtype (and of shapes: scalar, empty, non-contiguous), header
// layout, metadata, and one hand-crafted malformed file per validation rule, each rejected with
// its own message (asserted). Truncations at every length and random header corruptions must be
// rejected with a c10::Error, never a crash.
#include "layers/io/safetensors.h"

#include <dirent.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>

#include "tests/common/testing.h"

namespace tl {
namespace {

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tl_safetensors_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::system(("rm -rf '" + dir_ + "'").c_str()); }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  std::vector<std::string> files() const {
    std::vector<std::string> out;
    if (DIR* d = ::opendir(dir_.c_str())) {
      while (dirent* e = ::readdir(d))
        if (e->d_name[0] != '.') out.push_back(e->d_name);
      ::closedir(d);
    }
    return out;
  }
  std::string dir_;
};

// A raw file: 8-byte length (the header's own unless overridden), header text, data bytes.
void write_raw(const std::string& path, const std::string& header, size_t data_bytes, int64_t length = -1) {
  std::ofstream f(path, std::ios::binary);
  const uint64_t n = length < 0 ? header.size() : static_cast<uint64_t>(length);
  f.write(reinterpret_cast<const char*>(&n), 8);
  f << header;
  std::string data(data_bytes, '\x01');
  f << data;
}

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f << bytes;
}

TEST_F(Safetensors, RoundTripEveryDtype) {
  at::manual_seed(5);
  TensorMap t;
  t["f32"] = at::randn({3, 4});
  t["f64"] = at::randn({2, 3}, at::kDouble);
  t["f16"] = at::randn({5}).to(at::kHalf);
  t["bf16"] = at::randn({2, 2, 2}).to(at::kBFloat16);
  t["i64"] = at::randint(-1000000000000LL, 1000000000000LL, {4}, at::kLong);
  t["i32"] = at::randint(-100000, 100000, {3, 1}, at::kInt);
  t["i16"] = at::randint(-30000, 30000, {6}, at::kShort);
  t["i8"] = at::randint(-128, 127, {7}, at::kChar);
  t["u8"] = at::randint(0, 255, {2, 5}, at::kByte);
  t["bool"] = at::randn({9}) > 0;
  t["scalar"] = at::scalar_tensor(3.5);
  t["empty"] = at::zeros({0, 4});
  t["transposed"] = at::randn({4, 3}).t();  // non-contiguous input
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"note", "ünïcode \"quoted\""}};
  save_safetensors(path("a.safetensors"), t, meta);

  TensorMap back = load_safetensors(path("a.safetensors"));
  ASSERT_EQ(back.size(), t.size());
  for (const auto& [name, v] : t) {
    ASSERT_TRUE(back.count(name)) << name;
    EXPECT_EQ(back[name].scalar_type(), v.scalar_type()) << name;
    EXPECT_EQ(back[name].sizes(), v.sizes()) << name;
    EXPECT_TRUE(back[name].equal(v)) << name;
  }
  EXPECT_EQ(safetensors_metadata(path("a.safetensors")), meta);

  const SafetensorsHeader h = read_safetensors_header(path("a.safetensors"));
  EXPECT_EQ(h.data_start % 8, 0u) << "data area aligned to 8 bytes";
  EXPECT_EQ(h.tensors.size(), t.size());
  uint64_t expect_begin = 0;
  for (const auto& e : h.tensors) {
    EXPECT_EQ(e.begin, expect_begin) << e.name << ": packed without gaps";
    expect_begin = e.end;
  }
  EXPECT_EQ(h.data_start + expect_begin, h.file_size);

  // Loaded tensors own their memory: they survive the file's removal and can be written to.
  std::remove(path("a.safetensors").c_str());
  back["f32"].add_(1);
  EXPECT_TRUE(back["f32"].equal(t["f32"] + 1));
  EXPECT_TRUE(files().empty()) << "no temporary files left";
}

TEST_F(Safetensors, ReadsAFileWrittenByHand) {
  // Layout as the reference writer produces it, with a gap and trailing bytes (tolerated).
  std::string data(24, '\0');
  const float a[2] = {1.5f, -2.0f};
  const int64_t b[1] = {42};
  std::memcpy(&data[0], a, 8);
  std::memcpy(&data[16], b, 8);
  const std::string header =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"I64","shape":[],"data_offsets":[16,24]},)"
      R"("__metadata__":{"k":"v"}})";
  std::ofstream f(path("h.safetensors"), std::ios::binary);
  const uint64_t n = header.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f << header << data << "trailing";
  f.close();
  auto t = load_safetensors(path("h.safetensors"));
  EXPECT_TRUE(t.at("a").equal(at::tensor({1.5f, -2.0f})));
  EXPECT_EQ(t.at("b").dim(), 0);
  EXPECT_EQ(t.at("b").item<int64_t>(), 42);
  EXPECT_EQ(safetensors_metadata(path("h.safetensors")).at("k"), "v");
}

struct Malformed {
  const char* label;
  std::string header;
  size_t data_bytes;
  int64_t length;     // -1: the header's own length
  const char* error;  // expected part of the message
};

TEST_F(Safetensors, MalformedFilesRejectedWithTheirOwnMessage) {
  const std::string ok_entry = R"("x":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]})";
  const std::vector<Malformed> cases = {
      {"huge header length", "{}", 0, int64_t(1) << 40, "exceeds the limit of 100000000 bytes"},
      {"header past the end", "{" + ok_entry + "}", 16, 5000, "runs past the end of the file"},
      {"not an object start", "[1,2]", 0, -1, "does not start with '{'"},
      {"bad JSON", R"({"x": {"dtype": "F32", )", 0, -1, "not well-formed JSON"},
      {"trailing garbage", R"({} xyz)", 0, -1, "not well-formed JSON"},
      {"duplicate name", "{" + ok_entry + "," + ok_entry + "}", 16, -1, "names 'x' twice"},
      {"entry not an object", R"({"x": 5})", 0, -1, "tensor 'x': entry must be an object"},
      {"missing offsets", R"({"x":{"dtype":"F32","shape":[1]}})", 4, -1, "tensor 'x': missing 'data_offsets'"},
      {"unknown dtype", R"({"x":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}})", 4, -1,
       "tensor 'x': unknown dtype 'F33'; supported: BOOL, U8"},
      {"unsupported dtype", R"({"x":{"dtype":"U16","shape":[1],"data_offsets":[0,2]}})", 2, -1,
       "dtype U16 is valid safetensors but has no ATen type"},
      {"negative dim", R"({"x":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4, -1,
       "tensor 'x': 'shape' must be an array of non-negative integers"},
      {"fractional dim", R"({"x":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4, -1,
       "'shape' must be an array of non-negative integers"},
      {"shape overflow", R"({"x":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})", 4, -1,
       "more elements than fit in 64 bits"},
      {"offsets not a pair", R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4, -1,
       "'data_offsets' must be [begin, end]"},
      {"begin after end", R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", 8, -1, "has begin > end"},
      {"offsets out of range", R"({"x":{"dtype":"F32","shape":[256],"data_offsets":[0,1024]}})", 16, -1,
       "tensor 'x': data_offsets [0, 1024] lie outside the data area (16 bytes"},
      {"size mismatch", R"({"x":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})", 16, -1,
       "tensor 'x': shape [2, 2] of F32 needs 16 bytes but data_offsets [0, 12] span 12"},
      {"overlap",
       R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
       24, -1, "tensors 'a' (data_offsets [0, 16]) and 'b' (data_offsets [8, 24]) overlap"},
      {"metadata not strings", R"({"__metadata__":{"epoch":3}})", 0, -1,
       "'__metadata__' entry 'epoch' must be a string"},
  };
  for (const auto& c : cases) {
    const std::string p = path(std::string("bad.safetensors"));
    write_raw(p, c.header, c.data_bytes, c.length);
    const std::string msg = testing::what_of([&] { load_safetensors(p); });
    EXPECT_NE(msg.find(c.error), std::string::npos) << c.label << ": expected '" << c.error << "' in: " << msg;
    EXPECT_NE(msg.find(p), std::string::npos) << c.label << ": the message names the file: " << msg;
    // The header-only readers validate the same way.
    EXPECT_NE(testing::what_of([&] { safetensors_metadata(p); }).find(c.error), std::string::npos) << c.label;
  }
  write_bytes(path("tiny"), "abc");
  EXPECT_NE(testing::what_of([&] { load_safetensors(path("tiny")); }).find("file is 3 bytes, too small"),
            std::string::npos);
  EXPECT_NE(testing::what_of([&] { load_safetensors(path("absent")); }).find("cannot open for reading"),
            std::string::npos);
}

TEST_F(Safetensors, TruncationAtEveryLengthIsAnError) {
  TensorMap t = {{"w", at::randn({3, 5})}, {"b", at::arange(4, at::kLong)}};
  save_safetensors(path("full"), t, {{"k", "v"}});
  const std::string bytes = read_bytes(path("full"));
  const size_t data_start = read_safetensors_header(path("full")).data_start;
  // Every length through the header and the first tensor bytes, then every 8th (each error costs
  // a backtrace capture).
  for (size_t n = 0; n < bytes.size(); n += n < data_start + 16 ? 1 : 8) {
    write_bytes(path("cut"), bytes.substr(0, n));
    EXPECT_NE(testing::what_of([&] { load_safetensors(path("cut")); }), "<no error>")
        << "truncated to " << n << " bytes";
  }
}

TEST_F(Safetensors, CorruptedHeadersNeverCrash) {
  TensorMap t = {{"weight", at::randn({4, 4})}, {"bias", at::randn({4})}, {"step", at::scalar_tensor(3, at::kLong)}};
  save_safetensors(path("full"), t);
  const std::string bytes = read_bytes(path("full"));
  const uint64_t header_len = *reinterpret_cast<const uint64_t*>(bytes.data());
  std::mt19937 rng(1234);
  const std::string alphabet = "{}[]\",:0123456789-eE.FIU tx\\";
  int rejected = 0;
  for (int trial = 0; trial < 150; ++trial) {
    std::string b = bytes;
    for (int k = 0; k < 1 + trial % 3; ++k) {
      const size_t pos = 8 + rng() % header_len;
      b[pos] = alphabet[rng() % alphabet.size()];
    }
    write_bytes(path("corrupt"), b);
    try {
      TensorMap back = load_safetensors(path("corrupt"));
      // Accepted: then it must be self-consistent (every tensor readable).
      for (auto& [n, v] : back) EXPECT_GE(v.numel(), 0) << n;
    } catch (const c10::Error&) {
      ++rejected;
    }  // any other exception type fails the test
  }
  EXPECT_GT(rejected, 100) << "most corruptions must be caught";
}

TEST_F(Safetensors, SaveRejectsWhatItCannotStore) {
  EXPECT_NE(testing::what_of([&] {
              save_safetensors(path("x"), {{"c", at::randn({2}, at::kComplexFloat)}});
            }).find("tensor 'c': safetensors: dtype ComplexFloat cannot be stored"),
            std::string::npos);
  EXPECT_NE(testing::what_of([&] {
              save_safetensors(path("x"), {{"__metadata__", at::zeros({1})}});
            }).find("is reserved"),
            std::string::npos);
  EXPECT_NE(testing::what_of([&] {
              save_safetensors(path("x"), {{"", at::zeros({1})}});
            }).find("empty name"),
            std::string::npos);
  EXPECT_NE(testing::what_of([&] {
              save_safetensors(path("x"), {{"u", at::Tensor()}});
            }).find("tensor 'u' is undefined"),
            std::string::npos);
  EXPECT_NE(testing::what_of([&] {
              save_safetensors(dir_ + "/no/such/dir/x", {{"a", at::zeros({1})}});
            }).find("cannot create the temporary file"),
            std::string::npos);
  EXPECT_TRUE(files().empty()) << "nothing written";
}

TEST_F(Safetensors, OverwriteIsAtomic) {
  save_safetensors(path("m"), {{"a", at::ones({3})}});
  save_safetensors(path("m"), {{"a", at::zeros({5})}});
  EXPECT_TRUE(load_safetensors(path("m")).at("a").equal(at::zeros({5})));
  // A failing save (here: the target is a directory, so the final rename fails) removes its
  // temporary and leaves the target alone.
  ASSERT_EQ(::mkdir(path("d").c_str(), 0755), 0);
  const std::string msg = testing::what_of([&] { save_safetensors(path("d"), {{"a", at::ones({3})}}); });
  EXPECT_NE(msg.find("renaming"), std::string::npos) << msg;
  EXPECT_EQ(files().size(), 2u) << "only m and d remain";
}

}  // namespace
}  // namespace tl
