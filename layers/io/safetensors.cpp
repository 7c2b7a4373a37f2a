#include "layers/io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

namespace tl {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors data is little-endian; this reader copies bytes as they are");

using json = nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference implementation's limit

struct DtypeInfo {
  const char* name;
  at::ScalarType type;
  size_t size;
  bool supported;
};
// Every dtype the format defines; the unsupported ones have no ATen type in libtorch 1.13.
const DtypeInfo kDtypes[] = {
    {"BOOL", at::kBool, 1, true},  {"U8", at::kByte, 1, true},       {"I8", at::kChar, 1, true},
    {"I16", at::kShort, 2, true},  {"I32", at::kInt, 4, true},       {"I64", at::kLong, 8, true},
    {"F16", at::kHalf, 2, true},   {"BF16", at::kBFloat16, 2, true}, {"F32", at::kFloat, 4, true},
    {"F64", at::kDouble, 8, true}, {"U16", at::kByte, 2, false},     {"U32", at::kByte, 4, false},
    {"U64", at::kByte, 8, false},  {"F8_E4M3", at::kByte, 1, false}, {"F8_E5M2", at::kByte, 1, false},
};

std::string supported_list() {
  std::string s;
  for (const auto& d : kDtypes)
    if (d.supported) s += (s.empty() ? "" : ", ") + std::string(d.name);
  return s;
}

std::string errno_str() { return std::strerror(errno); }

std::string shape_str(const std::vector<int64_t>& shape) { return c10::str(at::IntArrayRef(shape)); }

// RAII file descriptor.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Reads exactly n bytes at `offset`; false on a short read (file shrank) or an error.
bool pread_all(int fd, void* dst, uint64_t n, uint64_t offset) {
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(n, 1u << 30));
    const ssize_t r = ::pread(fd, p, chunk, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<uint64_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return true;
}

bool write_all(int fd, const void* src, uint64_t n) {
  const auto* p = static_cast<const char*>(src);
  while (n > 0) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(n, 1u << 30));
    const ssize_t w = ::write(fd, p, chunk);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<uint64_t>(w);
  }
  return true;
}

// Header parsing and validation; `fd` open on `path`.
SafetensorsHeader parse_header(int fd, const std::string& path) {
  const std::string where = "safetensors file '" + path + "'";
  struct stat st {};
  TORCH_CHECK(::fstat(fd, &st) == 0, where, ": cannot stat: ", errno_str());
  TORCH_CHECK(S_ISREG(st.st_mode), where, ": not a regular file");
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  TORCH_CHECK(file_size >= 8, where, ": file is ", file_size,
              " bytes, too small to hold the 8-byte header length (truncated, or not a safetensors file)");
  uint64_t header_len = 0;
  TORCH_CHECK(pread_all(fd, &header_len, 8, 0), where, ": cannot read the header length: ", errno_str());
  TORCH_CHECK(header_len <= kMaxHeaderBytes, where, ": header length ", header_len, " bytes exceeds the limit of ",
              kMaxHeaderBytes, " bytes (corrupt file, or not a safetensors file)");
  TORCH_CHECK(header_len <= file_size - 8, where, ": header length ", header_len,
              " bytes runs past the end of the file (", file_size - 8,
              " bytes follow the length field): the file is truncated");
  TORCH_CHECK(header_len >= 2, where, ": header length ", header_len, " is too small for a JSON object");
  std::string text(header_len, '\0');
  TORCH_CHECK(pread_all(fd, text.data(), header_len, 8), where, ": cannot read the ", header_len,
              "-byte header: ", errno_str());
  TORCH_CHECK(text[0] == '{', where, ": the header does not start with '{' (got byte 0x", std::hex,
              static_cast<int>(static_cast<unsigned char>(text[0])), std::dec, "); not a safetensors file");

  // Top-level keys must be unique (a JSON object with a repeated key is ambiguous).
  std::set<std::string> keys;
  std::string duplicate;
  json::parser_callback_t on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1) {
      std::string k = parsed.get<std::string>();
      if (!keys.insert(k).second && duplicate.empty()) duplicate = k;
    }
    return true;
  };
  json header;
  try {
    header = json::parse(text.begin(), text.end(), on_event);
  } catch (const json::exception& e) {
    TORCH_CHECK(false, where, ": the header is not well-formed JSON: ", e.what());
  }
  TORCH_CHECK(header.is_object(), where, ": the header must be a JSON object, got ", header.type_name());
  TORCH_CHECK(duplicate.empty(), where, ": the header names '", duplicate, "' twice");

  SafetensorsHeader out;
  out.file_size = file_size;
  out.data_start = 8 + header_len;
  const uint64_t data_size = file_size - out.data_start;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      TORCH_CHECK(v.is_object(), where, ": '__metadata__' must be an object of string values, got ", v.type_name());
      for (auto m = v.begin(); m != v.end(); ++m) {
        TORCH_CHECK(m.value().is_string(), where, ": '__metadata__' entry '", m.key(), "' must be a string, got ",
                    m.value().type_name());
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string what = where + ", tensor '" + name + "'";
    TORCH_CHECK(v.is_object(), what, ": entry must be an object {dtype, shape, data_offsets}, got ", v.type_name());
    for (const char* field : {"dtype", "shape", "data_offsets"})
      TORCH_CHECK(v.contains(field), what, ": missing '", field, "' (each tensor needs dtype, shape, data_offsets)");
    SafetensorsEntry e;
    e.name = name;

    const json& dt = v["dtype"];
    TORCH_CHECK(dt.is_string(), what, ": 'dtype' must be a string, got ", dt.type_name());
    e.dtype_name = dt.get<std::string>();
    const DtypeInfo* info = nullptr;
    for (const auto& d : kDtypes)
      if (e.dtype_name == d.name) info = &d;
    TORCH_CHECK(info, what, ": unknown dtype '", e.dtype_name, "'; supported: ", supported_list());
    TORCH_CHECK(info->supported, what, ": dtype ", e.dtype_name,
                " is valid safetensors but has no ATen type in this build; supported: ", supported_list());
    e.dtype = info->type;

    const json& sh = v["shape"];
    TORCH_CHECK(sh.is_array(), what, ": 'shape' must be an array of non-negative integers, got ", sh.type_name());
    uint64_t numel = 1;
    bool overflow = false, has_zero = false;
    for (const auto& d : sh) {
      TORCH_CHECK(d.is_number_unsigned() && d.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX), what,
                  ": 'shape' must be an array of non-negative integers, got ", sh.dump());
      const uint64_t n = d.get<uint64_t>();
      e.shape.push_back(static_cast<int64_t>(n));
      if (n == 0)
        has_zero = true;
      else if (numel > std::numeric_limits<uint64_t>::max() / n)
        overflow = true;
      numel *= n;  // wraps only when overflow is set
    }
    // An overflow only matters when no dimension is 0.
    TORCH_CHECK(!overflow || has_zero, what, ": shape ", sh.dump(), " has more elements than fit in 64 bits");
    if (has_zero) numel = 0;
    TORCH_CHECK(numel <= std::numeric_limits<uint64_t>::max() / info->size, what, ": shape ", sh.dump(), " of ",
                e.dtype_name, " needs more bytes than fit in 64 bits");

    const json& off = v["data_offsets"];
    TORCH_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() && off[1].is_number_unsigned(), what,
                ": 'data_offsets' must be [begin, end] with non-negative integers, got ", off.dump());
    e.begin = off[0].get<uint64_t>();
    e.end = off[1].get<uint64_t>();
    TORCH_CHECK(e.begin <= e.end, what, ": data_offsets [", e.begin, ", ", e.end, "] has begin > end");
    TORCH_CHECK(e.end <= data_size, what, ": data_offsets [", e.begin, ", ", e.end, "] lie outside the data area (",
                data_size, " bytes after the header): offsets out of range, or the file is truncated");
    const uint64_t nbytes = numel * info->size;
    TORCH_CHECK(e.end - e.begin == nbytes, what, ": shape ", shape_str(e.shape), " of ", e.dtype_name, " needs ",
                nbytes, " bytes but data_offsets [", e.begin, ", ", e.end, "] span ", e.end - e.begin,
                " (shape and offsets disagree)");
    out.tensors.push_back(std::move(e));
  }

  // No overlap: sorted by begin, each non-empty range must start at or after the previous end.
  std::sort(out.tensors.begin(), out.tensors.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const SafetensorsEntry* prev = nullptr;
  for (const auto& e : out.tensors) {
    if (e.begin == e.end) continue;  // empty tensors occupy no bytes
    TORCH_CHECK(!prev || e.begin >= prev->end, where, ": tensors '", prev ? prev->name : "", "' (data_offsets [",
                prev ? prev->begin : 0, ", ", prev ? prev->end : 0, "]) and '", e.name, "' (data_offsets [", e.begin,
                ", ", e.end, "]) overlap");
    prev = &e;
  }
  return out;
}

void open_for_read(Fd& f, const std::string& path) {
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TORCH_CHECK(f.fd >= 0, "safetensors file '", path, "': cannot open for reading: ", errno_str());
}

// Parent directory of `path` ("." when none), for the temp file and the directory fsync.
std::string parent_dir(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

std::string safetensors_dtype_name(at::ScalarType type) {
  for (const auto& d : kDtypes)
    if (d.supported && d.type == type) return d.name;
  TORCH_CHECK(false, "safetensors: dtype ", type,
              " cannot be stored; supported: bool, uint8, int8, int16, int32, int64, ",
              "float16, bfloat16, float32, float64");
}

SafetensorsHeader read_safetensors_header(const std::string& path) {
  Fd f;
  open_for_read(f, path);
  return parse_header(f.fd, path);
}

std::map<std::string, std::string> safetensors_metadata(const std::string& path) {
  return read_safetensors_header(path).metadata;
}

TensorMap load_safetensors(const std::string& path) {
  Fd f;
  open_for_read(f, path);
  const SafetensorsHeader h = parse_header(f.fd, path);
  TensorMap out;
  for (const auto& e : h.tensors) {
    at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(e.dtype));
    const uint64_t nbytes = e.end - e.begin;
    errno = 0;
    const bool ok = pread_all(f.fd, t.data_ptr(), nbytes, h.data_start + e.begin);
    TORCH_CHECK(ok, "safetensors file '", path, "', tensor '", e.name, "': reading ", nbytes, " bytes at offset ",
                h.data_start + e.begin,
                " failed (file changed while reading?): ", errno ? errno_str() : std::string("short read"));
    out.emplace(e.name, std::move(t));
  }
  return out;
}

void save_safetensors(const std::string& path, const TensorMap& tensors,
                      const std::map<std::string, std::string>& metadata) {
  const std::string where = "save_safetensors('" + path + "')";
  // Validate and lay out everything before touching the file system.
  json header = json::object();
  std::vector<at::Tensor> blobs;  // CPU, contiguous, in the order of their offsets
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    TORCH_CHECK(!name.empty(), where, ": a tensor has an empty name");
    TORCH_CHECK(name != "__metadata__", where, ": '__metadata__' is reserved and cannot name a tensor");
    TORCH_CHECK(t.defined(), where, ": tensor '", name, "' is undefined");
    TORCH_CHECK(t.layout() == at::kStrided && !t.is_quantized(), where, ": tensor '", name,
                "' is not a dense strided tensor (sparse and quantized tensors cannot be stored)");
    std::string dtype;
    try {
      dtype = safetensors_dtype_name(t.scalar_type());
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, where, ": tensor '", name, "': ", e.what_without_backtrace());
    }
    at::Tensor c = t.detach().to(at::kCPU).contiguous();
    const uint64_t nbytes = static_cast<uint64_t>(c.numel()) * c.element_size();
    header[name] = {{"dtype", dtype}, {"shape", c.sizes().vec()}, {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
    blobs.push_back(std::move(c));
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception& e) {
    TORCH_CHECK(false, where, ": cannot encode the header (metadata and names must be valid UTF-8): ", e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // data area 8-byte aligned, as the reference writer does
  TORCH_CHECK(text.size() <= kMaxHeaderBytes, where, ": the header would be ", text.size(), " bytes, over the ",
              kMaxHeaderBytes, "-byte limit readers enforce");

  // Temp file next to the target, so the final rename stays on one file system.
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  Fd f;
  f.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  TORCH_CHECK(f.fd >= 0, where, ": cannot create the temporary file '", tmp, "': ", errno_str());
  bool committed = false;
  struct Cleanup {
    const std::string& tmp;
    bool& committed;
    ~Cleanup() {
      if (!committed) ::unlink(tmp.c_str());
    }
  } cleanup{tmp, committed};

  auto fail = [&](const std::string& step) {
    const std::string err = errno_str();
    TORCH_CHECK(false, where, ": ", step, " failed: ", err, " (nothing written to '", path, "')");
  };
  const uint64_t header_len = text.size();
  if (!write_all(f.fd, &header_len, 8) || !write_all(f.fd, text.data(), text.size())) fail("writing the header");
  size_t i = 0;
  for (const auto& [name, _] : tensors) {
    if (i == tensors.size() / 2) MidWriteHook::call();
    const at::Tensor& c = blobs[i++];
    if (!write_all(f.fd, c.data_ptr(), static_cast<uint64_t>(c.numel()) * c.element_size()))
      fail("writing tensor '" + name + "'");
  }
  if (::fsync(f.fd) != 0) fail("fsync");
  const int fd = f.fd;
  f.fd = -1;
  if (::close(fd) != 0) fail("close");
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("renaming '" + tmp + "' over the target");
  committed = true;
  // Persist the rename itself (best effort: some file systems refuse fsync on directories).
  Fd dir;
  dir.fd = ::open(parent_dir(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir.fd >= 0) ::fsync(dir.fd);
}

namespace {
thread_local MidWriteHook* current_hook = nullptr;
}  // namespace

MidWriteHook::MidWriteHook(std::function<void()> hook) : hook_(std::move(hook)), previous_(current_hook) {
  current_hook = this;
}
MidWriteHook::~MidWriteHook() { current_hook = previous_; }
void MidWriteHook::call() {
  if (current_hook && current_hook->hook_) current_hook->hook_();
}

}  // namespace tl
