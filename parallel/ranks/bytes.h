#pragma once
// Byte strings for the gathers between ranks (epoch statistics, the grid's structure, checkpoint
// parts): values appended with put, read back in the same order with a Reader that names what a
// short (garbled) string was.

#include <c10/util/Exception.h>

#include <cstring>
#include <string>

namespace tl::ranks {

inline void put(std::string& out, const void* p, size_t n) { out.append(static_cast<const char*>(p), n); }
template <class T>
void put(std::string& out, T v) {
  put(out, &v, sizeof(T));
}

struct Reader {
  const std::string& s;
  size_t at = 0;
  const std::string& what;
  void get(void* p, size_t n) {
    TORCH_CHECK(at + n <= s.size(), "rank 0: ", what, ": a rank sent ", s.size(), " bytes, too few (garbled)");
    std::memcpy(p, s.data() + at, n);
    at += n;
  }
  template <class T>
  T get() {
    T v;
    get(&v, sizeof(T));
    return v;
  }
};

}  // namespace tl::ranks
