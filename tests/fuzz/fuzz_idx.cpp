// IDX files (MNIST, Fashion-MNIST): images (3 dims) or labels (1 dim), picked by the first byte.
#include "tasks/data/dataset.h"
#include "tests/fuzz/fuzz.h"

TL_FUZZ_TARGET(idx) {
  tl::fuzz::Reader in(data, size);
  const int64_t dims = in.byte() % 2 ? 3 : 1;
  const std::string path = tl::fuzz::write_file("data.idx", in.ptr(), in.left());
  const at::Tensor t = tl::read_idx_file(path, dims);
  TL_FUZZ_CHECK(t.dim() == dims, "read_idx_file returned another number of dimensions");
  const bool gzip = in.left() >= 2 && in.ptr()[0] == 0x1f && in.ptr()[1] == 0x8b;
  if (!gzip) TL_FUZZ_CHECK(static_cast<size_t>(t.numel()) <= in.left(), "more elements than the file has bytes");
}
