#pragma once
// Index sets of sparse payloads: sorted, distinct flat indices into a tensor of `universe`
// elements, in the cheapest of three forms (chosen per payload, recorded in the params):
//   int    : one int32 per index (int64 when universe > 2^31)          n * 4 bytes
//   delta  : gaps idx[i] - idx[i-1] - 1 (idx[-1] = -1) as LEB128 varints  sum of varint lengths
//   bitmap : one bit per element, packed as pack_bits(mask, 1)             ceil(universe / 8)
// On ties: int, then bitmap, then delta.

#include <ATen/ATen.h>

#include <optional>
#include <string>

namespace tl::codec {

enum class IndexFormat : int64_t { kInt = 0, kDelta = 1, kBitmap = 2 };

/// "int32" (also used for int64 when needed), "delta", "bitmap"; "auto" -> nullopt (cheapest).
std::optional<IndexFormat> index_format_from_word(const std::string& word);
std::string index_format_word(std::optional<IndexFormat> f);
IndexFormat index_format_from_param(int64_t v, const char* codec);

/// Bytes per index of the `int` form.
int64_t index_int_width(int64_t universe);
int64_t index_int_bytes(int64_t n, int64_t universe);
int64_t index_bitmap_bytes(int64_t universe);
/// Exact size of the delta form of `idx` ((n) int64, sorted).
int64_t index_delta_bytes(const at::Tensor& idx);
/// Error naming `codec` unless `bytes` can hold n indices into `universe` in `format` (a header
/// check: int and bitmap sizes are exact, delta takes 1 to 9 bytes an index).
void check_index_bytes(IndexFormat format, int64_t bytes, int64_t n, int64_t universe, const char* codec);

struct EncodedIndex {
  IndexFormat format;
  at::Tensor bytes;  // (size) uint8, on idx's device
};

/// The form encode_index writes: `forced`, else the cheapest (delta only where idx is on the host).
IndexFormat pick_index_format(const at::Tensor& idx, int64_t universe, std::optional<IndexFormat> forced);
/// idx: (n) int64, strictly increasing, in [0, universe). forced: a fixed form, else the cheapest.
EncodedIndex encode_index(const at::Tensor& idx, int64_t universe, std::optional<IndexFormat> forced);
/// Where index bytes came from (see Note [host synchronisation] in compression/payload.cpp).
struct IndexSource {
  at::Tensor host_bytes;   // the same bytes on the host, if the payload still has them (host_body)
  bool from_wire = false;  // from another process: device bytes without a host copy are checked
};

/// Inverse of encode_index; corrupt bytes (wrong count, out of range, malformed varints) are an
/// error naming `codec`. Returns (n) int64, sorted, on the device of `bytes`. Bytes on the host,
/// or with a host copy in `source`, are always checked; device bytes made by this process's
/// encoder are decoded without checks (which would synchronise with the device).
at::Tensor decode_index(IndexFormat format, const at::Tensor& bytes, int64_t n, int64_t universe, const char* codec,
                        const IndexSource& source = {});

/// Positions (int64, ascending) of the true entries of `mask` (flattened), which must hold
/// exactly n of them; on the mask's device, without reading anything back to the host.
at::Tensor positions_of(const at::Tensor& mask, int64_t n);

}  // namespace tl::codec
