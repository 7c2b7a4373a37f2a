#include "compression/stateful/common.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace tl {
namespace stateful {

CompressorPtr build_inner(SpecArgs& args, size_t pos, const std::string& key, const std::string& wrapper) {
  auto call = args.spec(pos, key, /*required=*/true);
  TORCH_CHECK(call, wrapper, ": missing the inner codec (argument ", pos + 1, " or ", key, "=...), e.g. ", wrapper,
              "(topk(0.1))");
  return build_compressor(*call);
}

at::ScalarType accumulation_type(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

at::Tensor checked_sample_ids(const CodecContext& ctx, int64_t batch, const std::string& who) {
  TORCH_CHECK(ctx.sample_ids.defined(), who,
              ": needs the sample ids of the micro-batch (CodecContext::sample_ids, a (B) int64 tensor of dataset "
              "indices; set them with Boundary::set_context before the forward), but none were given");
  const at::Tensor& ids = ctx.sample_ids;
  TORCH_CHECK(ids.scalar_type() == at::kLong || ids.scalar_type() == at::kInt, who,
              ": sample ids must be int64 or int32, got ", ids.scalar_type());
  TORCH_CHECK(ids.dim() == 1 && ids.numel() == batch, who, ": expected one sample id per row of the micro-batch (",
              batch, "), got ids of shape ", ids.sizes());
  at::Tensor out = ids.to(at::kLong);
  if (batch == 0) return out;
  TORCH_CHECK(out.min().item<int64_t>() >= 0, who, ": sample ids must be non-negative");
  at::Tensor sorted = std::get<0>(out.sort());
  TORCH_CHECK(batch < 2 || !sorted.slice(0, 1).eq(sorted.slice(0, 0, -1)).any().item<bool>(), who,
              ": duplicate sample ids in one micro-batch (each sample's state is updated once per message)");
  return out;
}

// ---- WrappingCompressor ------------------------------------------------------------------------

WrappingCompressor::WrappingCompressor(std::string type_name, CompressorPtr inner)
    : Compressor(std::move(type_name)), inner_(std::move(inner)) {
  TORCH_CHECK(inner_, this->type_name(), ": inner codec is null");
  TORCH_CHECK(!inner_->has_transform(), this->type_name(), ": cannot wrap '", inner_->spec(),
              "': codecs with a learned or projecting transform (ae, subspace) only work as a boundary's "
              "forward codec, not inside another codec");
  register_module("inner", inner_);
}

// ---- StateBuffer -------------------------------------------------------------------------------

StateBuffer::StateBuffer(Module& owner, const std::string& name) {
  var_ = owner.register_buffer(name, at::zeros({0}));
  owner.mark_resizable(name);
}

at::Tensor StateBuffer::get(at::IntArrayRef shape, at::ScalarType dtype, at::Device device) {
  const at::Tensor& cur = var_.data();
  if (!cur.sizes().equals(shape)) {
    var_.set_data(at::zeros(shape, at::TensorOptions().dtype(dtype).device(device)));
  } else if (cur.scalar_type() != dtype || cur.device() != device) {
    var_.set_data(cur.to(device, dtype));
  }
  return var_.data();
}

void StateBuffer::reset() { var_.set_data(at::zeros({0}, var_.data().options())); }

// ---- SampleCache -------------------------------------------------------------------------------

SampleCache::SampleCache(Module& owner, const std::string& name, SampleCacheOptions opt, std::string who)
    : opt_(std::move(opt)), who_(std::move(who)) {
  TORCH_CHECK(opt_.dtype == at::kFloat || opt_.dtype == at::kHalf || opt_.dtype == at::kBFloat16, who_,
              ": cache dtype must be float32, float16 or bfloat16, got ", opt_.dtype);
  TORCH_CHECK(opt_.capacity >= 0, who_, ": capacity must be >= 0 (0: grow as ids appear), got ", opt_.capacity);
  TORCH_CHECK(opt_.file.empty() || opt_.capacity > 0, who_,
              ": a file-backed cache needs capacity=N (the number of samples), since the file is N x D values");
  rows_ = owner.register_buffer(name + "_rows", at::zeros({0, 0}, at::TensorOptions().dtype(opt_.dtype)));
  owner.mark_resizable(name + "_rows");
  seen_ = owner.register_buffer(name + "_seen", at::zeros({0}, at::kByte));
  owner.mark_resizable(name + "_seen");
}

SampleCache::~SampleCache() {
  if (map_) munmap(map_, map_bytes_);
  if (fd_ >= 0) close(fd_);
}

int64_t SampleCache::row_numel() const {
  if (!opt_.file.empty()) return map_row_numel_;
  return rows_.data().dim() == 2 ? rows_.data().size(1) : 0;
}

at::Tensor SampleCache::rows() const {
  if (!opt_.file.empty()) {
    if (!map_) return at::Tensor();
    return at::from_blob(map_, {opt_.capacity, map_row_numel_}, at::TensorOptions().dtype(opt_.dtype));
  }
  return rows_.data();
}

void SampleCache::map_file(int64_t row_numel) {
  const size_t bytes = static_cast<size_t>(opt_.capacity) * row_numel * c10::elementSize(opt_.dtype);
  const std::string& path = opt_.file;
  int fd = ::open(path.c_str(), O_RDWR);
  if (fd < 0) {
    TORCH_CHECK(errno == ENOENT, who_, ": cannot open cache file '", path, "': ", std::strerror(errno));
    // Create under a temporary name, size it, then rename: the final name never refers to a
    // half-made file.
    const std::string tmp = path + ".tmp." + std::to_string(::getpid());
    fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
    TORCH_CHECK(fd >= 0, who_, ": cannot create cache file '", tmp, "': ", std::strerror(errno));
    if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
      const std::string err = std::strerror(errno);
      ::close(fd);
      ::unlink(tmp.c_str());
      TORCH_CHECK(false, who_, ": cannot size/rename cache file '", path, "' (", bytes, " bytes): ", err);
    }
  } else {
    struct stat st {};
    TORCH_CHECK(::fstat(fd, &st) == 0, who_, ": cannot stat cache file '", path, "'");
    if (static_cast<size_t>(st.st_size) != bytes) {
      ::close(fd);
      TORCH_CHECK(false, who_, ": cache file '", path, "' has ", st.st_size, " bytes, expected ", bytes, " (capacity ",
                  opt_.capacity, " x ", row_numel, " values of ", opt_.dtype,
                  "); delete it or use the capacity and shapes it was made with");
    }
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const std::string err = std::strerror(errno);
    ::close(fd);
    TORCH_CHECK(false, who_, ": cannot memory-map cache file '", path, "': ", err);
  }
  fd_ = fd;
  map_ = p;
  map_bytes_ = bytes;
  map_row_numel_ = row_numel;
}

void SampleCache::ensure(int64_t d, int64_t max_id, at::Device device) {
  const int64_t have = row_numel();
  TORCH_CHECK(have == 0 || have == d, who_, ": the per-sample size changed from ", have, " to ", d,
              " values; a per-sample cache needs a fixed sample shape (pad sequences to one length)");
  TORCH_CHECK(opt_.capacity == 0 || max_id < opt_.capacity, who_, ": sample id ", max_id,
              " is outside the cache capacity ", opt_.capacity, " (ids must be in [0, capacity))");
  if (!opt_.file.empty()) {
    if (!map_) map_file(d);
    if (seen_.data().numel() != opt_.capacity) {
      TORCH_CHECK(seen_.data().numel() == 0, who_, ": the loaded 'seen' mask has ", seen_.data().numel(),
                  " entries but the cache file has capacity ", opt_.capacity);
      seen_.set_data(at::zeros({opt_.capacity}, at::TensorOptions().dtype(at::kByte)));
    }
    return;
  }
  const at::Tensor& r = rows_.data();
  const int64_t n = r.dim() == 2 && have > 0 ? r.size(0) : 0;
  if (n > max_id) return;
  // Grow geometrically (at most to the capacity: a bound, not an allocation up front; 8192 rows of
  // 1024 tokens x 1024 fp16 values would be 16 GB before the first id) and keep what was written.
  int64_t new_n = std::max(max_id + 1, n + n / 2);
  if (opt_.capacity > 0) new_n = std::min(new_n, opt_.capacity);
  at::Device dev = n > 0 ? r.device() : device;
  at::Tensor grown = at::zeros({new_n, d}, at::TensorOptions().dtype(opt_.dtype).device(dev));
  at::Tensor seen = at::zeros({new_n}, at::TensorOptions().dtype(at::kByte).device(dev));
  if (n > 0) {
    grown.narrow(0, 0, n).copy_(r);
    seen.narrow(0, 0, n).copy_(seen_.data().narrow(0, 0, std::min<int64_t>(n, seen_.data().numel())));
  }
  rows_.set_data(grown);
  seen_.set_data(seen);
}

at::Tensor SampleCache::gather(const at::Tensor& ids, int64_t row_numel, at::ScalarType dtype, at::Device device) {
  if (ids.numel() == 0) return at::zeros({0, row_numel}, at::TensorOptions().dtype(dtype).device(device));
  ensure(row_numel, ids.max().item<int64_t>(), device);
  at::Tensor r = rows();
  at::Tensor idx = ids.to(r.device());
  at::Tensor out = r.index_select(0, idx);
  if (!opt_.file.empty()) {
    // A reused file may hold rows from an earlier run: rows not written in this one read as zero.
    at::Tensor seen = seen_.data().to(r.device()).index_select(0, idx).to(out.scalar_type()).unsqueeze(1);
    out = out * seen;
  }
  return out.to(device, dtype);
}

void SampleCache::set(const at::Tensor& ids, const at::Tensor& rows_in) {
  if (ids.numel() == 0) return;
  TORCH_CHECK(rows_in.dim() == 2 && rows_in.size(0) == ids.numel(), who_,
              ": cache rows must be (B, D) with B = ", ids.numel(), ", got ", rows_in.sizes());
  ensure(rows_in.size(1), ids.max().item<int64_t>(), rows_in.device());
  at::Tensor r = rows();
  r.index_copy_(0, ids.to(r.device()), rows_in.to(r.device(), r.scalar_type()));
  seen_.mutable_data().index_fill_(0, ids.to(seen_.device()), 1);
}

at::Tensor SampleCache::rows_in_place(const at::Tensor& ids, int64_t row_numel, at::Device device) {
  if (!opt_.file.empty() || ids.numel() == 0) return at::Tensor();
  ensure(row_numel, ids.max().item<int64_t>(), device);
  const at::Tensor& r = rows_.data();
  return r.dim() == 2 && r.device() == device && r.is_contiguous() ? r : at::Tensor();
}

bool SampleCache::all_seen(const at::Tensor& ids) {
  if (ids.numel() == 0) return true;
  const at::Tensor& seen = seen_.data();
  if (ids.max().item<int64_t>() >= seen.numel()) return false;
  return seen.index_select(0, ids.to(seen.device())).ne(0).all().item<bool>();
}

void SampleCache::reset() {
  if (!opt_.file.empty()) {
    seen_.mutable_data().zero_();
    return;
  }
  rows_.set_data(at::zeros({0, 0}, rows_.data().options()));
  seen_.set_data(at::zeros({0}, seen_.data().options()));
}

}  // namespace stateful
}  // namespace tl
