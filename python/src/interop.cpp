// tapeline_py_interop: the C++ side of the Python package's interop tests (tests/python). It reads
// and writes files of payload bytes, so that a test can check that Python and the C++ library
// produce and accept the same bytes, and runs the grid's data-parallel sum for one step.
//
//   tapeline_py_interop encode SPEC IN OUT   IN: tensors as identity payloads; OUT: SPEC's payloads
//                                            of them, encoded in order by one codec (its state
//                                            carries over, as in a message stream)
//   tapeline_py_interop decode SPEC IN OUT   IN: SPEC's payloads; OUT: the decoded tensors as
//                                            identity payloads, decoded in order by one codec
//   tapeline_py_interop batch JOBS          each line of the file JOBS: "encode|decode<TAB>SPEC<TAB>IN<TAB>OUT",
//                                            run in order in this one process (libtorch loads once)
//   tapeline_py_interop dp-sum SPEC IN OUT   one rank of a data-parallel group (RANK, WORLD_SIZE,
//                                            MASTER_ADDR, MASTER_PORT): IN: this rank's gradients,
//                                            one per parameter; OUT: DataParallelSync's sums
//                                            (parallel/ranks/data_parallel.h), every parameter
//                                            compressed (those of fewer than 2 dims never are)
//
// A file is a list of payloads: int64 count, int64 length of each, then their bytes back to back
// (the layout of the grid's data-parallel messages). Files are written to a temporary name and
// renamed.

#include <ATen/ATen.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "autograd/variable.h"
#include "compression/codec_spec.h"
#include "compression/payload.h"
#include "compression/spec.h"
#include "parallel/ranks/data_parallel.h"
#include "parallel/ranks/rendezvous.h"
#include "parallel/ranks/transport.h"

namespace {

using tl::Payload;

std::vector<Payload> read_payloads(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK(in, "cannot read '", path, "'");
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto word = [&](size_t at) {
    TORCH_CHECK(at + 8 <= bytes.size(), "'", path, "' is truncated: ", bytes.size(), " bytes");
    int64_t v;
    std::memcpy(&v, bytes.data() + at, 8);
    return v;
  };
  const int64_t count = word(0);
  TORCH_CHECK(count >= 0 && count < (int64_t(1) << 20), "'", path, "': bad payload count ", count);
  std::vector<Payload> out;
  size_t at = 8 * static_cast<size_t>(1 + count);
  for (int64_t i = 0; i < count; ++i) {
    const int64_t n = word(8 * static_cast<size_t>(1 + i));
    TORCH_CHECK(n >= 0 && at + static_cast<size_t>(n) <= bytes.size(), "'", path, "': payload ", i, " of ", n,
                " bytes overruns the file (", bytes.size(), " bytes)");
    out.push_back(Payload::deserialize(bytes.data() + at, static_cast<size_t>(n)));
    at += static_cast<size_t>(n);
  }
  TORCH_CHECK(at == bytes.size(), "'", path, "': ", bytes.size() - at, " bytes after the last payload");
  return out;
}

void write_payloads(const std::string& path, const std::vector<Payload>& payloads) {
  std::vector<uint8_t> bytes(8 * (1 + payloads.size()));
  const int64_t count = static_cast<int64_t>(payloads.size());
  std::memcpy(bytes.data(), &count, 8);
  for (size_t i = 0; i < payloads.size(); ++i) {
    const int64_t n = static_cast<int64_t>(payloads[i].nbytes());
    std::memcpy(bytes.data() + 8 * (1 + i), &n, 8);
    const std::vector<uint8_t> p = payloads[i].serialize();
    bytes.insert(bytes.end(), p.begin(), p.end());
  }
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    TORCH_CHECK(out.good(), "cannot write '", tmp, "'");
  }
  TORCH_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename '", tmp, "' to '", path, "'");
}

std::vector<Payload> dp_sum(const tl::CodecSpec& spec, const std::vector<at::Tensor>& grads) {
  using namespace tl::ranks;
  const std::string problem = dp_codec_problem(spec);
  TORCH_CHECK(problem.empty(), "dp-sum: '", spec.text(), "' cannot compress data-parallel gradients: ", problem);
  const DistEnv env = DistEnv::from_env();
  TransportOptions options;
  options.comm_thread = true;  // the runtime's setting: sends go out while the rank receives
  auto transport = Transport::connect(env, options);
  std::vector<int> group;
  for (int r = 0; r < env.world_size; ++r) group.push_back(r);
  std::vector<std::pair<std::string, tl::Variable>> params;
  for (size_t i = 0; i < grads.size(); ++i) {
    tl::Variable p(at::zeros_like(grads[i]), true);
    p.set_grad(grads[i].clone());
    std::string name = "p";
    name += std::to_string(i);
    params.emplace_back(name, p);
  }
  DataParallelSync sync(*transport, group, env.rank, params, std::vector<bool>(params.size(), true), {}, {}, spec);
  sync.reduce_gradients(1, "tapeline_py_interop dp-sum");
  std::vector<Payload> out;
  for (auto& [n, p] : params) out.push_back(tl::identity_compressor()->encode(p.grad(), {}));
  transport->barrier("tapeline_py_interop dp-sum");
  return out;
}

// encode or decode: the payloads of IN through one new codec of `spec`, written to OUT.
void convert(const std::string& what, const std::string& spec, const std::string& in, const std::string& out) {
  tl::CompressorPtr codec = tl::CodecSpec(spec).build();
  tl::CodecContext ctx;
  std::vector<Payload> output;
  for (const Payload& p : read_payloads(in)) {
    if (what == "encode")
      output.push_back(codec->encode(tl::identity_compressor()->decode(p, ctx), ctx));
    else
      output.push_back(tl::identity_compressor()->encode(codec->decode(p, ctx), ctx));
  }
  write_payloads(out, output);
}

int run(int argc, char** argv) {
  const std::string usage = "usage: tapeline_py_interop encode|decode|dp-sum SPEC IN OUT, or batch JOBS";
  const std::string what = argc > 1 ? argv[1] : "";
  if (what == "batch" && argc == 3) {
    std::ifstream jobs(argv[2]);
    TORCH_CHECK(jobs, "cannot read '", argv[2], "'");
    std::string line;
    for (int n = 1; std::getline(jobs, line); ++n) {
      std::vector<std::string> f;
      for (size_t at = 0;;) {
        const size_t tab = line.find('\t', at);
        f.push_back(line.substr(at, tab == std::string::npos ? std::string::npos : tab - at));
        if (tab == std::string::npos) break;
        at = tab + 1;
      }
      TORCH_CHECK(f.size() == 4 && (f[0] == "encode" || f[0] == "decode"), argv[2], ":", n,
                  ": expected encode|decode<TAB>SPEC<TAB>IN<TAB>OUT, got '", line, "'");
      convert(f[0], f[1], f[2], f[3]);
    }
    return 0;
  }
  if (argc != 5) {
    std::cerr << usage << "\n";
    return 2;
  }
  const std::string spec = argv[2], in = argv[3], out = argv[4];
  if (what == "encode" || what == "decode") {
    convert(what, spec, in, out);
  } else if (what == "dp-sum") {
    std::vector<at::Tensor> grads;
    for (const Payload& p : read_payloads(in)) grads.push_back(tl::identity_compressor()->decode(p, {}));
    write_payloads(out, dp_sum(tl::CodecSpec(spec), grads));
  } else {
    std::cerr << "tapeline_py_interop: unknown command '" << what << "'; accepted: encode, decode, batch, dp-sum\n"
              << usage << "\n";
    return 2;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const c10::Error& e) {
    std::cerr << "tapeline_py_interop: " << e.what_without_backtrace() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "tapeline_py_interop: " << e.what() << "\n";
  }
  return 1;
}
