// CIFAR binary batches: CIFAR-10 or CIFAR-100 records, picked by the first byte.
#include "tasks/data/dataset.h"
#include "tests/fuzz/fuzz.h"

TL_FUZZ_TARGET(cifar) {
  tl::fuzz::Reader in(data, size);
  const int64_t classes = in.byte() % 2 ? 100 : 10;
  const std::string path = tl::fuzz::write_file("data_batch.bin", in.ptr(), in.left());
  const tl::ImageDataset d = tl::read_cifar_files({path}, classes);
  TL_FUZZ_CHECK(d.images.size(0) == d.labels.size(0), "images and labels differ in number");
  if (d.labels.numel() > 0)
    TL_FUZZ_CHECK(d.labels.min().item<int64_t>() >= 0 && d.labels.max().item<int64_t>() < classes, "a label out of range");
}
