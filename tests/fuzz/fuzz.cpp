#include "tests/fuzz/fuzz.h"

#include <c10/util/Exception.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <new>
#include <stdexcept>

namespace tl::fuzz {

std::map<std::string, Harness>& harnesses() {
  static std::map<std::string, Harness> all;
  return all;
}

void check(bool ok, const std::string& what) {
  if (ok) return;
  std::fprintf(stderr, "tapeline fuzz: invariant broken: %s\n", what.c_str());
  std::abort();
}

bool run_one(Harness h, const uint8_t* data, size_t size, std::string* why) {
  try {
    h(data, size);
    return true;
  } catch (const std::bad_alloc& e) {
    // An allocation the input sized: parsers check sizes against what the input holds before
    // allocating, so an out-of-memory here means one did not.
    check(false, std::string("std::bad_alloc: an allocation sized by the input (") + e.what() + ")");
  } catch (const std::length_error& e) {
    check(false, std::string("std::length_error: a length taken from the input unchecked (") + e.what() + ")");
  } catch (const c10::Error& e) {
    const std::string m = e.what_without_backtrace();
    check(!m.empty(), "an error without a message");
    if (why) *why = m;
  } catch (const std::exception& e) {
    check(std::string(e.what()).size() > 0, "an error without a message");
    if (why) *why = e.what();
  }
  return false;
}

std::string scratch_dir() {
  static const std::string dir = [] {
    std::filesystem::path p = std::filesystem::temp_directory_path() / ("tapeline-fuzz-" + std::to_string(getpid()));
    std::filesystem::create_directories(p);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(std::filesystem::temp_directory_path() / ("tapeline-fuzz-" + std::to_string(getpid())),
                                  ec);
    });
    return p.string();
  }();
  return dir;
}

std::string write_file(const std::string& name, const uint8_t* data, size_t size) {
  const std::filesystem::path p = std::filesystem::path(scratch_dir()) / name;
  std::filesystem::create_directories(p.parent_path());
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  out.close();
  if (!out) throw std::runtime_error("fuzz: cannot write " + p.string());
  return p.string();
}

std::string write_file(const std::string& name, const std::string& bytes) {
  return write_file(name, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}

std::string Reader::chunk() {
  size_t n = byte();
  n |= static_cast<size_t>(byte()) << 8;
  n = std::min(n, left());
  std::string s(reinterpret_cast<const char*>(p_), n);
  p_ += n;
  return s;
}

}  // namespace tl::fuzz
