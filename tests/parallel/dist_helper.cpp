// parallel_dist_helper: one rank of the multi-process tests (transport_test.cpp, launch_test.cpp).
// It reads the torchrun variables like any tapeline rank and runs one scenario:
//
//   exchange N [comm]   2 ranks: rank 0 sends N payloads of many sizes (empty body included),
//                       rank 1 checks each against its own copy and echoes the bytes back; rank 0
//                       checks the echo byte for byte. Then all-reduce, broadcast, gather, barrier.
//                       Prints "OK exchange ..." and exits 0.
//   die VICTIM [send [thread]]  after a message each way and a barrier, VICTIM kills itself with
//                       SIGKILL; the survivor then receives from it (or, with "send", sends 64 MiB
//                       to it, from the comm thread with "thread") and must fail.
//   silent              rank 1 connects and then says nothing; rank 0's recv must time out.
//   silent_collective   rank 1 connects and never joins the all-reduce rank 0 starts.
//   garbage KIND        rank 1 sends a forged header (KIND: magic | size | tag | pieces_count: a
//                       body in 1 piece), a body with a bit flipped after its checksum (bitflip),
//                       a truncated payload in a well-formed message (KIND payload), or a body of
//                       3 MiB in pieces (with TL_PIECES_MIN at most that) (Note [bodies in pieces]) corrupted by corrupt_next_send
//                       (KIND pieces_bitflip | pieces_truncate | pieces_oversize | pieces_trailer);
//                       rank 0 must reject it.
//   link                rank 1 receives over an emulated link; checks nothing arrives early.
//   timed COUNT BYTES...  2 ranks, ping-pong: rank 0 sends a message of BYTES (each size in turn,
//                       COUNT times, after 5 unmeasured warm-up rounds of the largest size) and
//                       waits for rank 1's 1-byte ack. Rank 1 measures each message's one-way time,
//                       from the sender's stamp (taken in Transport::send) to its recv() returning,
//                       and prints per size "TIMED bytes=B count=C total_s=.. mean_s=.. median_s=..
//                       min_s=.. max_s=.. link_s=.." (link_s: mean time slept for link emulation).
//                       For netns_test.cpp: a tc-shaped loopback against the link emulation.
//   group_sum [die]     2 or more ranks: sums of random float32 and float64 tensors of several sizes through
//                       Transport::start_group_sum, each checked bit for bit against
//                       all_reduce_in_rank_order of the same tensors; prints "OK group_sum". With
//                       "die", rank 1 kills itself once the group is open and rank 0's sum must fail.
//   hello               prints a line to stdout and to stderr, exits 0.
//   fail RANK CODE      RANK exits with CODE once all ranks are up (TL_UP_DIR) and 0.3 s more (CODE
//                       "kill": SIGKILL itself); the others sleep (with "stubborn", ignoring SIGTERM)
//                       until stopped.
//
// A survivor that catches the expected TransportError prints "CAUGHT peer=P elapsed=S: what" and
// exits 3. TL_TIMEOUT_S sets dist.timeout_s (default 10). TL_LINK_MBPS and TL_LINK_MS (numbers >= 0;
// unset: 0) set TransportOptions::link, the link emulated into this rank from every peer (0 Mbit/s:
// unlimited), for any scenario.
#include <ATen/detail/CUDAHooksInterface.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "compression/payload.h"
#include "parallel/ranks/group_sum.h"
#include "parallel/ranks/rendezvous.h"
#include "parallel/ranks/transport.h"

using namespace tl;
using namespace tl::ranks;

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Payload i of the exchange: identical on both ranks (seeded), sizes from 0 to ~1.5 MB.
// Message i's payload: sizes from 0 to 1.5 MiB, growing the posted capacity (Note [posted
// capacity] in transport.h) at messages 4, 5 and 7; messages 14-33 small (it shrinks after
// message 31), 34 on as at first (it grows again).
Payload make_payload(int i) {
  static const int64_t sizes[] = {0, 1, 3, 1000, 65536, 250000, 7, 393216, 12345, 1};
  const bool small = i >= 14 && i < 34;
  const int64_t n = (small ? sizes[i % 10] % 4099 : sizes[i % 10]) + 17 * (i / 10);
  Payload p;
  p.codec = codec_id("identity");
  p.dtype = at::kFloat;
  p.shape = {n};
  p.params = {i, -i};
  at::manual_seed(1000 + i);
  at::Tensor x = at::randn({n});
  p.body = n ? x.view(at::kByte).clone() : at::empty({0}, at::kByte);
  return p;
}

// The number in environment variable `name`, `fallback` when unset or empty; any other text than a
// finite number >= 0 is an error naming the variable.
double env_number(const char* name, double fallback) {
  const char* s = std::getenv(name);
  if (!s || !*s) return fallback;
  char* end = nullptr;
  const double v = std::strtod(s, &end);
  if (*end != '\0' || !std::isfinite(v) || v < 0)
    throw std::invalid_argument(std::string(name) + "='" + s + "' is not a number >= 0");
  return v;
}

TransportOptions options_from_env() {
  TransportOptions o;
  o.timeout_s = env_number("TL_TIMEOUT_S", 10.0);
  o.link.bandwidth_mbps = env_number("TL_LINK_MBPS", 0.0);
  o.link.latency_ms = env_number("TL_LINK_MS", 0.0);
  // Bodies in pieces (Note [bodies in pieces]) from TL_PIECES_MIN bytes, of TL_PIECE_BYTES each.
  o.pieces_min_bytes = static_cast<int64_t>(env_number("TL_PIECES_MIN", double(o.pieces_min_bytes)));
  o.piece_bytes = std::max<int64_t>(1, static_cast<int64_t>(env_number("TL_PIECE_BYTES", double(o.piece_bytes))));
  const char* backend = std::getenv("TL_BACKEND");  // "gloo" (default) or "nccl"
  if (backend && *backend) o.backend = backend;
  return o;
}

[[noreturn]] void caught(const TransportError& e, double t0) {
  std::printf("CAUGHT peer=%d elapsed=%.2f: %s\n", e.peer(), now_s() - t0, e.what());
  std::fflush(stdout);
  std::_Exit(3);  // no destructors: the process group's threads may wait on the dead peer
}

int run_exchange(const DistEnv& env, int n, bool comm) {
  TransportOptions o = options_from_env();
  o.comm_thread = comm;
  auto t = Transport::connect(env, o);
  const int me = t->rank();
  if (me == 0) {
    std::vector<std::vector<uint8_t>> sent(n);
    for (int i = 0; i < n; ++i) sent[i] = make_payload(i).serialize();
    auto check_echo = [&](int i) {
      Message m = t->recv(1, i, "echo " + std::to_string(i));
      if (m.size() != sent[i].size() || (m.size() && std::memcmp(m.data(), sent[i].data(), m.size()) != 0)) {
        std::printf("FAIL echo %d: %zu bytes back, %zu sent\n", i, m.size(), sent[i].size());
        std::exit(1);
      }
    };
    for (int i = 0; i < n; ++i) {
      if (i % 2) {  // in a message buffer (the frame is the buffer), or copied into a frame
        at::Tensor b = Transport::message_buffer(static_cast<int64_t>(sent[i].size()));
        if (!sent[i].empty()) std::memcpy(b.data_ptr<uint8_t>(), sent[i].data(), sent[i].size());
        t->send(1, b, i, "payload " + std::to_string(i));
      } else {
        std::vector<uint8_t> copy = sent[i];
        t->send(1, std::move(copy), i, "payload " + std::to_string(i));
      }
      if (!comm) check_echo(i);
    }
    if (comm)
      for (int i = 0; i < n; ++i) check_echo(i);
  } else if (me == 1) {
    for (int i = 0; i < n; ++i) {
      Message info;
      Payload p = t->recv_payload(0, i, "payload " + std::to_string(i), at::kCPU, &info);
      Payload want = make_payload(i);
      if (p.shape != want.shape || p.params != want.params || p.codec != want.codec || !at::equal(p.body, want.body)) {
        std::printf("FAIL payload %d differs\n", i);
        std::exit(1);
      }
      if (i % 3)
        t->send_payload(0, p, i, "echo " + std::to_string(i));
      else
        t->send(0, p.serialize(), i, "echo " + std::to_string(i));
    }
  }
  t->flush("after exchange");
  const TransportStats s = t->stats();  // the exchange's messages only
  // Collectives every runtime needs.
  at::Tensor x = at::full({5}, double(me + 1), at::kFloat);
  if (o.backend == "nccl")  // NCCL reduces CUDA tensors, on this rank's device
    x = x.to(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(
                                       cuda_device_for(env.local_rank, at::detail::getCUDAHooks().getNumGPUs()))));
  t->all_reduce_sum(x, "tied embeddings");
  const float want_sum = t->world_size() * (t->world_size() + 1) / 2.0f;
  if (!at::allclose(x.cpu(), at::full({5}, want_sum, at::kFloat))) {
    std::printf("FAIL all-reduce\n");
    return 1;
  }
  const std::string b = t->broadcast_bytes(me == 0 ? std::string("config\0bytes", 12) : std::string(), 0, "bcast");
  if (b != std::string("config\0bytes", 12)) {
    std::printf("FAIL broadcast\n");
    return 1;
  }
  const auto g = t->gather_bytes(std::string(me + 1, char('a' + me)), 0, "checkpoint");
  if (me == 0) {
    for (int r = 0; r < t->world_size(); ++r)
      if (g.at(r) != std::string(r + 1, char('a' + r))) {
        std::printf("FAIL gather from %d\n", r);
        return 1;
      }
  }
  t->barrier("end");
  std::printf("OK exchange rank %d agent_store=%d sent=%lld received=%lld bytes_sent=%lld in_pieces=%lld\n", me,
              int(env.agent_store), (long long)s.messages_sent, (long long)s.messages_received, (long long)s.bytes_sent,
              (long long)s.sent_in_pieces);
  return 0;
}

int run_die(const DistEnv& env, int victim, bool in_send, bool thread) {
  TransportOptions o = options_from_env();
  o.comm_thread = thread;
  auto t = Transport::connect(env, o);
  // One message each way first: the survivor's next header recv is then already posted.
  const int other = 1 - t->rank();
  if (t->rank() == 0) {
    t->send(other, std::vector<uint8_t>(100, 1), 0, "warm-up");
    t->recv(other, 0, "warm-up");
  } else {
    t->recv(other, 0, "warm-up");
    t->send(other, std::vector<uint8_t>(100, 1), 0, "warm-up");
  }
  t->barrier("before the fault");
  if (t->rank() == victim) {
    ::raise(SIGKILL);
  }
  const double t0 = now_s();
  try {
    if (in_send) {
      std::vector<uint8_t> big(64 << 20, 7);
      t->send(victim, std::move(big), 1, "step 12, boundary 1 forward send");
      t->flush("step 12, end of the forward");  // with the comm thread, the error surfaces here
    } else {
      t->recv(victim, 1, "step 12, boundary 2 forward");
    }
  } catch (const TransportError& e) {
    caught(e, t0);
  }
  std::printf("FAIL: no error from the dead rank\n");
  return 1;
}

int run_group_sum(const DistEnv& env, bool die) {
  TransportOptions o = options_from_env();
  o.comm_thread = true;  // as the runtime runs
  auto t = Transport::connect(env, o);
  std::vector<int> group;  // every rank
  for (int r = 0; r < t->world_size(); ++r) group.push_back(r);
  t->open_group(group, "group_sum");
  if (die && t->rank() == 1) ::raise(SIGKILL);
  const double t0 = now_s();
  int checked = 0;
  try {
    for (const at::ScalarType dtype : {at::kFloat, at::kDouble})
      for (const int64_t n : {int64_t(1), int64_t(1000), int64_t(1) << 20, (int64_t(3) << 20) + 7}) {
        at::manual_seed(7 * t->rank() + n);
        const at::Tensor mine = (at::randn({n}, dtype) * 10).exp_().sub_(1);  // wide exponents: rounding matters
        at::Tensor started = mine.clone(), second = (mine * 3).exp_();
        // Two sums in flight at once (more than two members: the second's start may begin the
        // first's all-gather, Note [group sums of more than two in rank order]).
        t->start_group_sum(group, started, "step 4, data-parallel gradients, bucket " + std::to_string(checked));
        t->start_group_sum(group, second, "step 4, data-parallel gradients, bucket " + std::to_string(checked) + "b");
        t->wait_group_sums();
        const at::Tensor second_ordered =
            all_reduce_in_rank_order(*t, group, t->rank(), (mine * 3).exp_(), 200 + checked, "ordered");
        if (std::memcmp(second.data_ptr(), second_ordered.data_ptr(), static_cast<size_t>(n * second.element_size())) != 0) {
          std::printf("FAIL %s second sum of %lld values differs from the sum in rank order\n", c10::toString(dtype),
                      static_cast<long long>(n));
          return 1;
        }
        const at::Tensor ordered =
            all_reduce_in_rank_order(*t, group, t->rank(), mine.clone(), 100 + checked, "ordered");
        if (std::memcmp(started.data_ptr(), ordered.data_ptr(), static_cast<size_t>(n * started.element_size())) != 0) {
          std::printf("FAIL %s sum of %lld values differs from the sum in rank order\n", c10::toString(dtype),
                      static_cast<long long>(n));
          return 1;
        }
        ++checked;
      }
  } catch (const TransportError& e) {
    caught(e, t0);
  }
  if (die) {
    std::printf("FAIL: no error from the dead rank\n");
    return 1;
  }
  t->barrier("end");
  std::printf("OK group_sum rank %d checked=%d\n", t->rank(), checked);
  return 0;
}

int run_silent(const DistEnv& env, bool collective) {
  auto t = Transport::connect(env, options_from_env());
  t->barrier("connected");
  if (t->rank() == 1) {
    std::this_thread::sleep_for(std::chrono::seconds(120));  // the test kills us long before
    return 0;
  }
  const double t0 = now_s();
  try {
    if (collective) {
      at::Tensor x = at::ones({4});
      t->all_reduce_sum(x, "step 3, tied embeddings");
    } else {
      t->recv(1, 0, "step 3, boundary 1 backward");
    }
  } catch (const TransportError& e) {
    caught(e, t0);
  }
  std::printf("FAIL: no error from the silent rank\n");
  return 1;
}

// Three ranks in a chain of waits: rank 2 stops itself (SIGSTOP), rank 1 waits for rank 2 and
// rank 0 for rank 1, which still runs. Rank 1 starts waiting 1 s later, so rank 0 times out first,
// while rank 1 is still alive: its error must name rank 2 too (Note [who stalled the run]).
int run_stalled_chain(const DistEnv& env) {
  auto t = Transport::connect(env, options_from_env());
  t->barrier("connected");
  if (t->rank() == 2) {
    ::raise(SIGSTOP);  // the test kills us once the others are done
    return 0;
  }
  const double t0 = now_s();
  try {
    if (t->rank() == 1) {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      t->recv(2, 0, "step 5, boundary 2 forward");
    } else {
      t->recv(1, 0, "step 5, boundary 1 forward");
    }
  } catch (const TransportError& e) {
    std::printf("SUSPECTS");
    for (int r : e.suspects()) std::printf(" %d", r);
    std::printf("\n");
    caught(e, t0);
  }
  std::printf("FAIL: no error from the stalled chain\n");
  return 1;
}

int run_garbage(const DistEnv& env, const std::string& kind) {
  auto t = Transport::connect(env, options_from_env());
  if (t->rank() == 1 && kind == "payload") {  // a well-formed message whose body is half a payload
    std::vector<uint8_t> bytes = make_payload(4).serialize();
    bytes.resize(bytes.size() / 2);
    t->send(0, std::move(bytes), 0, "truncating");
    t->flush("truncating");
    std::this_thread::sleep_for(std::chrono::seconds(2));
    std::_Exit(0);
  }
  if (t->rank() == 1 && kind == "bitflip") {  // a valid frame whose body lost a bit after the checksum
    std::vector<uint8_t> body = make_payload(3).serialize();  // 1000 floats: inline in the frame
    std::vector<int64_t> h(wire::kHeaderWords, 0);
    h[wire::kWordMagic] = wire::kMagic;
    h[wire::kWordBytes] = static_cast<int64_t>(body.size());
    h[wire::kWordBodyCrc] = wire::body_crc_word(body.data(), body.size());
    h[wire::kWordCheck] = wire::check_word(h.data());
    body[body.size() / 2] ^= 0x10;
    t->inject_raw_header_for_testing(0, h, "flipping", body);
    std::this_thread::sleep_for(std::chrono::seconds(2));
    std::_Exit(0);
  }
  if (t->rank() == 1 && kind.rfind("pieces_", 0) == 0 && kind != "pieces_count") {
    const std::map<std::string, Corruption> kinds = {{"pieces_bitflip", Corruption::BitFlip},
                                                     {"pieces_truncate", Corruption::Truncate},
                                                     {"pieces_oversize", Corruption::Oversize},
                                                     {"pieces_trailer", Corruption::Trailer}};
    at::manual_seed(77);
    at::Tensor body = at::randint(0, 256, {int64_t(3) << 20}, at::kByte);  // 3 pieces of 1 MiB
    t->corrupt_next_send(kinds.at(kind));
    t->send(0, body, 0, "corrupting");
    t->flush("corrupting");
    std::this_thread::sleep_for(std::chrono::seconds(2));
    std::_Exit(0);
  }
  if (t->rank() == 1) {
    std::vector<int64_t> h(wire::kHeaderWords, 0);
    if (kind == "magic") {
      h = {0x0123456789ABCDEFLL, 42, -7, 99, 12345, 777};
    } else {
      h[wire::kWordMagic] = wire::kMagic;
      h[wire::kWordSeq] = 0;
      h[wire::kWordTag] = kind == "tag" ? 5 : 0;
      h[wire::kWordBytes] = kind == "size" ? (int64_t(1) << 50) : kind == "pieces_count" ? (int64_t(3) << 20) : 10;
      h[wire::kWordStamp] = 0;
      if (kind == "pieces_count") {  // a body in one piece
        h[wire::kWordBodyCrc] = wire::kBodyCrcPresent;
        h[wire::kWordLayout] = wire::kLayoutPieces | (int64_t(1) << wire::kPieceCountShift);
      }
      h[wire::kWordCheck] = wire::check_word(h.data());
    }
    t->inject_raw_header_for_testing(0, h, "forging");
    std::this_thread::sleep_for(std::chrono::seconds(2));  // let rank 0 read it before we go
    std::_Exit(0);
  }
  const double t0 = now_s();
  try {
    if (kind == "payload" || kind == "bitflip")
      t->recv_payload(1, 0, "step 1, boundary 1 forward");
    else
      t->recv(1, 0, "step 1, boundary 1 forward");
  } catch (const TransportError& e) {
    caught(e, t0);
  }
  std::printf("FAIL: garbage accepted\n");
  return 1;
}

// Rank 0 queues 3 messages of 100 kB at once (comm thread); rank 1 receives them over an emulated
// 8 Mbit/s, 50 ms link: 0.1 s of transmission each, back to back, then 50 ms. No message may be
// returned before the model's delivery time (sender's stamp + queue + transmission + latency).
int run_link(const DistEnv& env) {
  TransportOptions o = options_from_env();
  o.comm_thread = env.rank == 0;
  const LinkSpec spec{8, 50};
  o.link_from[0] = spec;
  auto t = Transport::connect(env, o);
  const int64_t n = 100000;
  if (t->rank() == 0) {
    for (int i = 0; i < 3; ++i) t->send(1, std::vector<uint8_t>(n, uint8_t(i)), i, "link " + std::to_string(i));
    t->flush("link");
  } else {
    Link model(spec);
    for (int i = 0; i < 3; ++i) {
      Message m = t->recv(0, i, "link " + std::to_string(i));
      const double got = steady_ns_to_s(steady_now_ns());
      const double due = model.transmit(m.sent_s, n);
      std::printf("message %d: due %.3f s after its stamp, returned after %.3f s (link wait %.3f s, wire %.6f s)\n", i,
                  due - m.sent_s, got - m.sent_s, m.link_s, m.transfer_s);
      if (got < due - 1e-6 || m.size() != size_t(n) || m.data()[0] != uint8_t(i)) {
        std::printf("FAIL link message %d\n", i);
        return 1;
      }
    }
    std::printf("OK link\n");
  }
  t->barrier("end");
  return 0;
}

// Note [one-way times]. A ping-pong, not a stream: each message leaves an idle link, and rank 1's ack
// follows, on the same connection, the announcement of its next frame recv (Note [pre-posted frames
// and reused bodies]), so rank 0's next send goes out at once instead of waiting for it. The time
// measured is then what a link charges one message (latency + transmission), whether a real shaped
// link or the transport's emulation (tests/parallel/netns_test.cpp explains why they agree).
int run_timed(const DistEnv& env, int count, const std::vector<int64_t>& sizes) {
  auto t = Transport::connect(env, options_from_env());
  if (t->world_size() != 2) throw std::invalid_argument("timed: needs exactly 2 ranks");
  constexpr size_t kWarmup = 5;  // rounds of the largest size while TCP opens its windows, not measured
  const int64_t largest = *std::max_element(sizes.begin(), sizes.end());
  std::vector<int64_t> rounds(kWarmup, largest);
  for (int64_t n : sizes) rounds.insert(rounds.end(), count, n);
  std::vector<std::vector<double>> one_way(sizes.size());  // by size, measured rounds only
  std::vector<double> link_s(sizes.size(), 0.0);
  for (size_t i = 0; i < rounds.size(); ++i) {
    const int64_t n = rounds[i], tag = int64_t(i);
    const std::string ctx = "timed round " + std::to_string(i);
    if (t->rank() == 0) {
      t->send(1, std::vector<uint8_t>(n, uint8_t(i)), tag, ctx);
      t->recv(1, tag, ctx + " ack");
      continue;
    }
    Message m = t->recv(0, tag, ctx);
    const double got = steady_ns_to_s(steady_now_ns());
    if (m.size() != size_t(n) || (n && m.data()[n - 1] != uint8_t(i))) {
      std::printf("FAIL timed round %zu: %zu bytes, %lld sent\n", i, m.size(), (long long)n);
      return 1;
    }
    if (i >= kWarmup) {
      const size_t k = (i - kWarmup) / count;  // which size
      one_way[k].push_back(got - m.sent_s);
      link_s[k] += m.link_s;
    }
    t->send(0, std::vector<uint8_t>(1, 0), tag, ctx + " ack");
  }
  t->barrier("end");
  if (t->rank() == 1) {
    for (size_t k = 0; k < sizes.size(); ++k) {
      std::vector<double> v = one_way[k];
      std::sort(v.begin(), v.end());
      const double total = std::accumulate(v.begin(), v.end(), 0.0);
      const size_t c = v.size();
      const double median = c % 2 ? v[c / 2] : 0.5 * (v[c / 2 - 1] + v[c / 2]);
      std::printf(
          "TIMED bytes=%lld count=%zu total_s=%.6f mean_s=%.6f median_s=%.6f min_s=%.6f max_s=%.6f link_s=%.6f\n",
          (long long)sizes[k], c, total, total / c, median, v.front(), v.back(), link_s[k] / c);
    }
    std::printf("OK timed\n");
  }
  return 0;
}

int run_fail(const DistEnv& env, int bad, const std::string& code, bool stubborn) {
  std::printf("rank %d of %d up (MASTER_PORT=%d LOCAL_RANK=%d)\n", env.rank, env.world_size, env.master_port,
              env.local_rank);
  std::fflush(stdout);
  // With TL_UP_DIR, every rank marks itself up there and the failing rank waits for all marks, so
  // that it never fails before the others have started (bounded: 30 s).
  const char* up = std::getenv("TL_UP_DIR");
  if (up) {
    std::FILE* f = std::fopen((std::string(up) + "/up_" + std::to_string(env.rank)).c_str(), "w");
    if (f) std::fclose(f);
  }
  if (env.rank == bad) {
    for (int tries = 0; up && tries < 1500; ++tries) {
      int n = 0;
      for (int r = 0; r < env.world_size; ++r)
        n += ::access((std::string(up) + "/up_" + std::to_string(r)).c_str(), F_OK) == 0;
      if (n == env.world_size) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    if (code == "kill") ::raise(SIGKILL);
    std::fprintf(stderr, "rank %d failing with status %s\n", env.rank, code.c_str());
    return std::atoi(code.c_str());
  }
  if (stubborn) ::signal(SIGTERM, SIG_IGN);
  std::this_thread::sleep_for(std::chrono::seconds(60));
  std::printf("rank %d was not stopped\n", env.rank);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> a(argv + 1, argv + argc);
  if (a.empty()) {
    std::fprintf(stderr,
                 "usage: parallel_dist_helper "
                 "exchange|die|group_sum|silent|silent_collective|stalled_chain|garbage|link|timed|hello|fail ...\n");
    return 2;
  }
  try {
    const DistEnv env = DistEnv::from_env();
    const std::string& mode = a[0];
    if (mode == "exchange") return run_exchange(env, a.size() > 1 ? std::atoi(a[1].c_str()) : 20, a.size() > 2);
    if (mode == "die")
      return run_die(env, std::atoi(a.at(1).c_str()), a.size() > 2 && a[2] == "send", a.size() > 3 && a[3] == "thread");
    if (mode == "silent") return run_silent(env, false);
    if (mode == "group_sum") return run_group_sum(env, a.size() > 1 && a[1] == "die");
    if (mode == "link") return run_link(env);
    if (mode == "timed") {
      const int count = std::atoi(a.at(1).c_str());
      std::vector<int64_t> sizes;
      for (size_t i = 2; i < a.size(); ++i) sizes.push_back(std::atoll(a[i].c_str()));
      if (count < 1 || sizes.empty() || *std::min_element(sizes.begin(), sizes.end()) < 0)
        throw std::invalid_argument("usage: timed COUNT BYTES... (COUNT >= 1, BYTES >= 0)");
      return run_timed(env, count, sizes);
    }
    if (mode == "silent_collective") return run_silent(env, true);
    if (mode == "stalled_chain") return run_stalled_chain(env);
    if (mode == "garbage") return run_garbage(env, a.at(1));
    if (mode == "hello") {
      std::printf("hello from rank %d of %d\nsecond line %d\n", env.rank, env.world_size, env.rank);
      std::fprintf(stderr, "stderr of rank %d", env.rank);  // no newline: flushed at exit
      return 0;
    }
    if (mode == "fail") return run_fail(env, std::atoi(a.at(1).c_str()), a.at(2), a.size() > 3);
    std::fprintf(stderr, "unknown mode '%s'\n", mode.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::printf("ERROR %s\n", e.what());
    std::fflush(stdout);
    std::_Exit(1);
  }
}
