#pragma once
// safetensors reader and writer (https://github.com/huggingface/safetensors, format section):
//   [8 bytes: header length N, little-endian u64][N bytes: JSON header][data area]
// The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets
// relative to the data area) plus an optional "__metadata__" object of string values.
//
// Reading validates the whole header before any tensor is allocated or read: header length
// within 100 MB and within the file, well-formed JSON object, no duplicate names, known dtype,
// shape of non-negative integers, data_offsets inside the data area, byte size = numel * dtype
// size, no two tensors overlapping. Each failure is a c10::Error naming the file, the tensor and
// what is accepted. Gaps between tensors and trailing bytes are tolerated (never read).
// Tensors are read with pread into freshly allocated CPU tensors, so they own their memory.
//
// Writing is atomic: a temporary file in the same directory, fsync, then rename over `path`; on
// any failure the temporary is removed and an existing file at `path` is left untouched.

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "layers/module.h"  // TensorMap

namespace tl {

/// Dtypes read and written: BOOL U8 I8 I16 I32 I64 F16 BF16 F32 F64. (U16/U32/U64 and F8 types are
/// valid safetensors but have no ATen type in every supported libtorch; reading them is an error.)
struct SafetensorsEntry {
  std::string name;
  std::string dtype_name;  // as in the file, e.g. "F32"
  at::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets in the data area
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> tensors;  // sorted by offset
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // file offset of the data area (8 + header length)
  uint64_t file_size = 0;
};

/// Reads and validates the header only (cheap: nothing of the data area is read).
SafetensorsHeader read_safetensors_header(const std::string& path);

/// Every tensor of the file, on the CPU, owning its memory.
TensorMap load_safetensors(const std::string& path);

/// The "__metadata__" map (empty when absent); validates the header like load does.
std::map<std::string, std::string> safetensors_metadata(const std::string& path);

/// Writes `tensors` (any device; copied to the CPU, contiguous) and `metadata` atomically.
/// Names must be non-empty and not "__metadata__"; dtypes as listed above.
void save_safetensors(const std::string& path, const TensorMap& tensors,
                      const std::map<std::string, std::string>& metadata = {});

/// Fault injection (parallel/ranks/fault.h): while one exists on this thread, save_safetensors calls
/// `hook` once halfway through writing its temporary file (after half of the tensors), so that a
/// test can kill the writer there. Nests; the newest wins.
class MidWriteHook {
 public:
  explicit MidWriteHook(std::function<void()> hook);
  ~MidWriteHook();
  MidWriteHook(const MidWriteHook&) = delete;
  MidWriteHook& operator=(const MidWriteHook&) = delete;
  /// Calls this thread's newest hook, if any.
  static void call();

 private:
  std::function<void()> hook_;
  MidWriteHook* previous_;
};

/// Safetensors dtype name of an ATen type ("F32"); error for types the format cannot hold.
std::string safetensors_dtype_name(at::ScalarType type);

}  // namespace tl
