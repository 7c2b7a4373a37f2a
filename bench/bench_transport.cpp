// bench_transport: throughput of tapeline's Transport (header + body messages, parallel/ranks/)
// against raw c10d send/recv of the same bytes (one preallocated tensor of a size both sides
// know), between 2 local processes over Gloo. Tapeline's sender writes each message into one of
// 4 buffers from Transport::message_buffer, as a caller that builds its messages does (the header
// goes in front of the body, no copy); ratio_copied_median sends the plain tensor instead (the
// transport copies it into a frame, summing it in the same pass). Run without arguments: it launches its own 2 ranks
// (parallel/ranks/launch.h); under torchrun it is one of them.
//
// Per message size (64 KiB .. 64 MiB): rank 0 streams K messages to rank 1, which then sends a
// 1-byte ack; throughput = K * size / (time until the ack). Raw and tapeline runs alternate; the
// best of the repeats is kept (3x more repeats up to 1 MiB: latency-bound, the most sensitive to
// a busy machine). On a shared machine the best of each is a lucky moment of its own, so the
// median over repeats of the paired ratio (raw and tapeline of the same repeat, moments apart) is
// printed too. JSON lines on stdout (rank 0):
//   {"bench":"transport","bytes":...,"messages":K,"raw_MBps":...,"tapeline_MBps":...,
//    "tapeline_thread_MBps":...,"ratio":tapeline/raw,"ratio_thread":...,"ratio_median":...,
//    "ratio_thread_median":...,"ratio_no_checksum_median":...,"ratio_copied_median":...,
//    "target":0.9,"target_no_checksum":0.95}
// ratio_no_checksum_median: the blocking transport without body checksums (TransportOptions::
// checksum = false), so that ratio_median / ratio_no_checksum_median is what the CRC-32C costs.
// ratio_whole_median: the blocking transport with checksums but no body in pieces (Note [bodies in
// pieces] in transport.h; pieces_min_bytes = 0): each body summed before it is sent and after it
// arrived; "pieces" says how many pieces the other variants with checksums send a body in (0:
// whole).
// Before the messages, rank 0 times the body checksum (parallel/ranks/checksum.h) against memcpy
// of the same bytes, best of the repeats, for the same sizes:
//   {"bench":"crc32c","bytes":...,"crc_GBps":...,"crc_sse42_GBps":...,"memcpy_GBps":...,
//    "ratio":crc/memcpy,"ratio_sse42":...}
// (crc_sse42: the crc32-instruction path alone, what crc32c was before the folding path.)
// Each message line also carries the CPU the two processes spent (getrusage: user + system, every
// thread, the kernel's socket copies included), summed over both ranks, for raw c10d and for the
// blocking transport with and without checksums: "raw_cores" = CPU seconds / wall seconds while
// raw c10d streams (2 on a 2-core machine: the transfer holds every core), "cpu_ratio" = raw CPU /
// tapeline CPU (with checksums) and "cpu_ratio_no_checksum". Where raw_cores reaches the core
// count, cpu_ratio bounds the throughput ratio: the checksum passes can only run on cores the
// transfer needs (docs/PIPELINE.md, "What the checksum costs in CPU").
// Options: --repeats R (default 5), --min-kib K (default 64), --max-mib M (default 64), --timeout S
// (default 60), --pieces-min-kib K (bodies in pieces from K KiB; default TransportOptions'
// pieces_min_bytes; 0: never), --piece-kib K (their pieces' size; default TransportOptions').
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "parallel/ranks/c10d_compat.h"
#include "parallel/ranks/checksum.h"
#include "parallel/ranks/launch.h"
#include "parallel/ranks/rendezvous.h"
#include "parallel/ranks/transport.h"

using namespace tl::ranks;

namespace {

using tl::bench::now_s;

struct Args {
  int repeats = 5;
  int min_kib = 64;
  int max_mib = 64;
  double timeout_s = 60;
  int pieces_min_kib = static_cast<int>(tl::ranks::TransportOptions().pieces_min_bytes >> 10);
  int piece_kib = static_cast<int>(tl::ranks::TransportOptions().piece_bytes >> 10);
};

Args parse(int argc, char** argv) {
  Args a;
  tl::bench::parse_options("bench_transport", argc, argv,
                           {{"--repeats", &a.repeats},
                            {"--min-kib", &a.min_kib},
                            {"--max-mib", &a.max_mib},
                            {"--timeout", nullptr, &a.timeout_s},
                            {"--pieces-min-kib", &a.pieces_min_kib},
                            {"--piece-kib", &a.piece_kib}});
  if (a.pieces_min_kib < 0 || a.piece_kib < 1) {
    std::fprintf(stderr,
                 "bench_transport: --pieces-min-kib takes 0 (never) or more, --piece-kib 1 or more; got %d, %d\n",
                 a.pieces_min_kib, a.piece_kib);
    std::exit(2);
  }
  return a;
}

// The checksum's rate against memcpy (rank 0, before the ranks connect).
void bench_checksum(const Args& args) {
  for (int64_t size = int64_t(args.min_kib) << 10; size <= (int64_t(args.max_mib) << 20); size *= 4) {
    const int k = static_cast<int>(std::max<int64_t>(1, (int64_t(256) << 20) / size));
    std::vector<uint8_t> a(static_cast<size_t>(size), 7), b(static_cast<size_t>(size), 1);
    double best[3] = {1e30, 1e30, 1e30};  // crc, crc (sse42 only), memcpy
    uint32_t sink = 0;
    for (int rep = 0; rep < args.repeats; ++rep) {
      for (int which = 0; which < 3; ++which) {
        const double t0 = now_s();
        for (int i = 0; i < k; ++i) {
          if (which == 0) sink += crc32c(a.data(), a.size());
          if (which == 1) sink += crc32c_sse42_only(a.data(), a.size());
          if (which == 2) std::memcpy(b.data(), a.data(), a.size()), sink += b[static_cast<size_t>(i) % b.size()];
        }
        best[which] = std::min(best[which], now_s() - t0);
      }
    }
    const double gb = double(size) * k / 1e9;
    std::printf(
        "{\"bench\":\"crc32c\",\"bytes\":%lld,\"crc_GBps\":%.2f,\"crc_sse42_GBps\":%.2f,\"memcpy_GBps\":%.2f,"
        "\"ratio\":%.3f,\"ratio_sse42\":%.3f,\"sink\":%u}\n",
        (long long)size, gb / best[0], gb / best[1], gb / best[2], best[2] / best[0], best[2] / best[1], sink);
    std::fflush(stdout);
  }
}

// CPU seconds (user + system) of this process so far, all threads.
double cpu_s() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

int run_rank(const Args& args) {
  const DistEnv env = DistEnv::from_env();
  if (env.world_size != 2) {
    std::fprintf(stderr, "bench_transport: needs exactly 2 ranks, got WORLD_SIZE=%d\n", env.world_size);
    return 2;
  }
  TransportOptions o;
  o.timeout_s = args.timeout_s;
  o.pieces_min_bytes = int64_t(args.pieces_min_kib) << 10;
  o.piece_bytes = int64_t(args.piece_kib) << 10;
  auto tl_plain = Transport::connect(env, o);
  // A second transport with the communication thread, and the raw process group, on the same store.
  DistEnv env_thread = env;
  env_thread.restart_count = 1000;  // its own key prefix
  DistEnv env_raw = env;
  env_raw.restart_count = 1001;
  env_thread.agent_store = env_raw.agent_store = true;  // rank 0's first transport hosts the store
  o.comm_thread = true;
  auto tl_thread = Transport::connect(env_thread, o);
  // A third, blocking and without body checksums: what the CRC-32C costs (Note [body checksum]).
  DistEnv env_nocrc = env;
  env_nocrc.restart_count = 1002;
  env_nocrc.agent_store = true;
  o.comm_thread = false;
  o.checksum = false;
  auto tl_nocrc = Transport::connect(env_nocrc, o);
  // A fourth, blocking, with checksums, every body whole (summed before it is sent, after it came).
  DistEnv env_whole = env;
  env_whole.restart_count = 1003;
  env_whole.agent_store = true;
  o.checksum = true;
  const int64_t pieces_min = o.pieces_min_bytes;
  o.pieces_min_bytes = 0;
  auto tl_whole = Transport::connect(env_whole, o);
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(args.timeout_s * 1000));
  auto raw_store = compat::make_prefix_store(
      env_raw.store_prefix(), compat::make_tcp_store(env.master_addr, env.master_port, false, env.world_size, timeout));
  auto raw = compat::make_gloo(raw_store, env.rank, env.world_size, timeout, env.master_addr);
  const int me = env.rank;
  if (me == 0) bench_checksum(args);

  at::Tensor ack = at::zeros({1}, at::kByte);
  for (int64_t size = int64_t(args.min_kib) << 10; size <= (int64_t(args.max_mib) << 20); size *= 4) {
    const int k = static_cast<int>(std::max<int64_t>(4, std::min<int64_t>(64, (int64_t(256) << 20) / size)));
    at::Tensor buf = at::full({size}, 7, at::kByte);
    std::vector<at::Tensor> bufs;  // tapeline's: message buffers, one per message of the window
    for (int i = 0; i < 4; ++i) bufs.push_back(Transport::message_buffer(size).fill_(7));
    double best_raw = 1e30, best_tl = 1e30, best_thread = 1e30;
    std::vector<double> paired, paired_thread, paired_nocrc, paired_copied, paired_whole;  // raw time / tapeline time
    // This rank's CPU seconds and the wall seconds: raw, tapeline blocking, tapeline without checksums.
    double cpu[3] = {0, 0, 0}, wall[3] = {0, 0, 0};
    // Small messages are latency-bound, hence the most sensitive to other processes on the
    // machine: they get more (cheap) repeats, so that the best of them finds a quiet moment.
    const int repeats = size <= (int64_t(1) << 20) ? 3 * args.repeats : args.repeats;
    for (int rep = 0; rep < repeats; ++rep) {
      // raw c10d: both sides know the size.
      tl_plain->barrier("raw start");
      double c0 = cpu_s();
      double t0 = now_s();
      for (int i = 0; i < k; ++i) {
        std::vector<at::Tensor> v{buf};
        compat::wait(me == 0 ? raw->send(v, 1, 1) : raw->recv(v, 0, 1), timeout);
      }
      {
        std::vector<at::Tensor> v{ack};
        compat::wait(me == 0 ? raw->recv(v, 1, 2) : raw->send(v, 0, 2), timeout);
      }
      const double raw_s = now_s() - t0;
      cpu[0] += cpu_s() - c0, wall[0] += raw_s;
      best_raw = std::min(best_raw, raw_s);
      // tapeline: blocking, with the communication thread, without checksums, blocking with the
      // plain tensor (copied into a frame), and blocking with every body whole.
      for (int variant = 0; variant < 5; ++variant) {
        Transport* t = variant == 1   ? tl_thread.get()
                       : variant == 2 ? tl_nocrc.get()
                       : variant == 4 ? tl_whole.get()
                                      : tl_plain.get();
        t->barrier("tapeline start");
        c0 = cpu_s();
        t0 = now_s();
        for (int i = 0; i < k; ++i) {
          if (me == 0)
            t->send(1, variant == 3 ? buf : bufs[static_cast<size_t>(i) % bufs.size()], i, "bench");
          else
            t->recv(0, i, "bench");
        }
        if (me == 0)
          t->recv(1, -1, "ack");
        else
          t->send(0, ack, 0, "ack");
        const double dt = now_s() - t0;
        if (variant == 0 || variant == 2) cpu[variant / 2 + 1] += cpu_s() - c0, wall[variant / 2 + 1] += dt;
        if (variant >= 2) {
          (variant == 2 ? paired_nocrc : variant == 3 ? paired_copied : paired_whole).push_back(raw_s / dt);
          continue;
        }
        (t == tl_plain.get() ? best_tl : best_thread) = std::min(t == tl_plain.get() ? best_tl : best_thread, dt);
        (t == tl_plain.get() ? paired : paired_thread).push_back(raw_s / dt);
      }
    }
    // Rank 1's CPU seconds join rank 0's.
    {
      at::Tensor mine = at::tensor(std::vector<double>(cpu, cpu + 3), at::kDouble);
      std::vector<at::Tensor> v{mine};
      compat::wait(me == 0 ? raw->recv(v, 1, 3) : raw->send(v, 0, 3), timeout);
      if (me == 0)
        for (int i = 0; i < 3; ++i) cpu[i] += mine[i].item<double>();
    }
    if (me == 0) {
      auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        const size_t n = v.size();
        return n == 0 ? 0.0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
      };
      const double mb = double(size) * k / 1e6;
      std::printf(
          "{\"bench\":\"transport\",\"backend\":\"gloo\",\"bytes\":%lld,\"messages\":%d,\"repeats\":%d,"
          "\"raw_MBps\":%.1f,\"tapeline_MBps\":%.1f,\"tapeline_thread_MBps\":%.1f,\"ratio\":%.3f,"
          "\"ratio_thread\":%.3f,\"ratio_median\":%.3f,\"ratio_thread_median\":%.3f,"
          "\"ratio_no_checksum_median\":%.3f,\"ratio_copied_median\":%.3f,\"ratio_whole_median\":%.3f,"
          "\"pieces\":%lld,\"raw_cores\":%.2f,\"cpu_ratio\":%.3f,\"cpu_ratio_no_checksum\":%.3f,\"target\":0.9,"
          "\"target_no_checksum\":0.95}\n",
          (long long)size, k, repeats, mb / best_raw, mb / best_tl, mb / best_thread, best_raw / best_tl,
          best_raw / best_thread, median(paired), median(paired_thread), median(paired_nocrc), median(paired_copied),
          median(paired_whole),
          (long long)(pieces_min > 0 && size >= pieces_min ? wire::piece_count(size, int64_t(args.piece_kib) << 10)
                                                           : 0),
          cpu[0] / wall[0], cpu[0] / cpu[1], cpu[0] / cpu[2]);
      std::fflush(stdout);
    }
  }
  tl_whole->barrier("end");
  tl_nocrc->barrier("end");
  tl_thread->barrier("end");
  tl_plain->barrier("end");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  return tl::bench::run_as_ranks("transport", 2, argc, argv, [&] { return run_rank(args); });
}
