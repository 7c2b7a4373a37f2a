"""Fashion-MNIST from the IDX files the Debian package dataset-fashion-mnist installs (the data the
C++ toolkit's tasks read, tasks/data/dataset.cpp), for the examples and lab 5."""
import gzip
import os
import pathlib

import torch

DEFAULT_ROOT = "/usr/share/datasets/fashion-mnist"


def _idx(path: pathlib.Path) -> torch.Tensor:
    raw = gzip.open(path, "rb").read() if path.suffix == ".gz" else path.read_bytes()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 8:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes (magic {raw[:4].hex()})")
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    body = raw[4 + 4 * ndim:]
    n = 1
    for d in dims:
        n *= d
    if len(body) != n:
        raise ValueError(f"{path}: {len(body)} bytes of data for the shape {dims} ({n} expected)")
    return torch.frombuffer(bytearray(body), dtype=torch.uint8).reshape(dims)


def fashion_mnist(split: str = "train", limit: int = 0, root: str = ""):
    """(images (N, 784) float32 in [0, 1], labels (N) int64) of the split "train" or "test"; the
    first `limit` samples when limit > 0. root: the folder of the IDX files (default
    $TAPELINE_FASHION_MNIST or the Debian package's folder)."""
    if split not in ("train", "test"):
        raise ValueError(f"fashion_mnist: split '{split}' is not accepted; accepted: train, test")
    base = pathlib.Path(root or os.environ.get("TAPELINE_FASHION_MNIST", DEFAULT_ROOT))
    prefix = "train" if split == "train" else "t10k"
    files = []
    for kind in ("images-idx3-ubyte", "labels-idx1-ubyte"):
        found = [base / f"{prefix}-{kind}{ext}" for ext in (".gz", "") if (base / f"{prefix}-{kind}{ext}").is_file()]
        if not found:
            raise FileNotFoundError(f"fashion_mnist: no {prefix}-{kind}[.gz] in {base} (install the Debian package "
                                    "dataset-fashion-mnist, or set TAPELINE_FASHION_MNIST to the folder)")
        files.append(found[0])
    images, labels = _idx(files[0]), _idx(files[1])
    if limit > 0:
        images, labels = images[:limit], labels[:limit]
    return images.reshape(images.shape[0], -1).float().div_(255), labels.long()
