#include "parallel/ranks/transport.h"

#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/util/Exception.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <iostream>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include "parallel/ranks/c10d_compat.h"
#include "parallel/ranks/checksum.h"

namespace tl::ranks {
namespace {

using namespace wire;  // Note [wire protocol]: header words.
// c10d tags of the two halves of a message (slots distinct from any collective's).
constexpr int kFrameTag = 0x7A01;
constexpr int kBodyTag = 0x7A02;
constexpr int kPieceTag = 0x7A03;  // Note [bodies in pieces]
constexpr int kTrailerTag = 0x7A04;
// Internal message tags (callers' tags are >= 0).
constexpr int64_t kGatherTag = -2;

}  // namespace

FrameHeader wire::parse_frame_header(const uint8_t* data, size_t size, int64_t expected_seq,
                                     const int64_t* expected_tag, int64_t max_body_bytes) {
  auto fail = [](const std::string& why) { throw std::runtime_error(why); };
  if (size < static_cast<size_t>(kHeaderBytes))
    fail("frame of " + std::to_string(size) + " bytes, shorter than the " + std::to_string(kHeaderBytes) +
         "-byte header");
  int64_t h[kHeaderWords];
  std::memcpy(h, data, kHeaderBytes);
  if (h[kWordMagic] != kMagic) {
    std::ostringstream os;
    os << std::hex << h[kWordMagic];
    fail("not a tapeline message (bad magic 0x" + os.str() +
         "): garbage on the connection, or another program/version at the other end");
  }
  if (h[kWordCheck] != check_word(h)) fail("corrupt message header (check word mismatch)");
  const int64_t n = h[kWordBytes];
  if (n < 0 || n > max_body_bytes)
    fail("announced body of " + std::to_string(n) + " bytes; accepted 0.." + std::to_string(max_body_bytes) +
         " (TransportOptions::max_message_bytes)");
  if (h[kWordSeq] != expected_seq)
    fail("got message #" + std::to_string(h[kWordSeq]) + ": messages were lost or reordered");
  if (expected_tag && h[kWordTag] != *expected_tag)
    fail("got tag " + std::to_string(h[kWordTag]) + ", expected " + std::to_string(*expected_tag) +
         ": the two ranks' schedules disagree");
  const int64_t crc = h[kWordBodyCrc];
  if (crc != 0 && (crc >> 32) != 1) fail("corrupt message header (body checksum word)");
  const int64_t layout = h[kWordLayout];
  int64_t pieces = 0;
  if ((layout & 0xFF) == kLayoutPieces) {  // Note [bodies in pieces]
    pieces = layout >> kPieceCountShift;
    if (pieces < 2 || pieces > kMaxPieces || piece_span(n, pieces, pieces - 1).bytes <= 0)
      fail("corrupt message header: a body of " + std::to_string(n) + " bytes in " + std::to_string(pieces) +
           " pieces; accepted 2.." + std::to_string(kMaxPieces) + " pieces of at least one byte each");
    if (crc != kBodyCrcPresent) fail("corrupt message header (body checksum word of a body in pieces)");
  } else if (layout != kLayoutInFrame && layout != kLayoutSeparate) {
    fail("corrupt message header (layout word " + std::to_string(layout) + ")");
  }
  FrameHeader out;
  out.seq = h[kWordSeq], out.tag = h[kWordTag], out.body_bytes = n, out.stamp_ns = h[kWordStamp];
  out.body_crc = crc, out.layout = layout, out.pieces = pieces;
  return out;
}

wire::PieceSpan wire::piece_span(int64_t n, int64_t count, int64_t k) {
  const int64_t step = ((n + count - 1) / count + 63) / 64 * 64;
  PieceSpan s;
  s.offset = std::min(n, k * step);
  s.bytes = std::min(n, s.offset + step) - s.offset;
  return s;
}

int64_t wire::piece_count(int64_t n, int64_t piece_bytes) {
  int64_t count = std::clamp<int64_t>((n + piece_bytes / 2) / std::max<int64_t>(piece_bytes, 1), 2, kMaxPieces);
  while (count >= 2 && piece_span(n, count, count - 1).bytes <= 0) --count;
  return count >= 2 ? count : 0;
}

namespace {
int64_t trailer_check(const int64_t* w, int64_t words) {
  int64_t x = kCheckSalt;
  for (int64_t i = 0; i + 1 < words; ++i) x ^= w[i];
  return x;
}
}  // namespace

std::vector<int64_t> wire::make_trailer(int64_t seq, const std::vector<uint32_t>& sums) {
  const int64_t count = static_cast<int64_t>(sums.size());
  std::vector<int64_t> w(static_cast<size_t>(trailer_words(count)));
  w[0] = kTrailerMagic, w[1] = seq, w[2] = count;
  for (int64_t k = 0; k < count; ++k) w[static_cast<size_t>(3 + k)] = sums[static_cast<size_t>(k)];
  w.back() = trailer_check(w.data(), static_cast<int64_t>(w.size()));
  return w;
}

std::vector<uint32_t> wire::parse_trailer(const uint8_t* data, size_t size, int64_t expected_seq,
                                          int64_t expected_count) {
  auto fail = [](const std::string& why) { throw std::runtime_error("corrupt trailer of a body in pieces: " + why); };
  const int64_t words = trailer_words(expected_count);
  if (size != static_cast<size_t>(words * 8))
    fail(std::to_string(size) + " bytes, expected " + std::to_string(words * 8));
  std::vector<int64_t> w(static_cast<size_t>(words));
  std::memcpy(w.data(), data, size);
  if (w[0] != kTrailerMagic) fail("bad magic");
  if (w.back() != trailer_check(w.data(), words)) fail("check word mismatch");
  if (w[1] != expected_seq) fail("it is message #" + std::to_string(w[1]) + "'s");
  if (w[2] != expected_count) fail(std::to_string(w[2]) + " pieces, the header said " + std::to_string(expected_count));
  std::vector<uint32_t> sums(static_cast<size_t>(expected_count));
  for (int64_t k = 0; k < expected_count; ++k) {
    const int64_t v = w[static_cast<size_t>(3 + k)];
    if (v < 0 || v > int64_t(0xFFFFFFFF)) fail("piece " + std::to_string(k) + "'s sum is not a CRC-32C");
    sums[static_cast<size_t>(k)] = static_cast<uint32_t>(v);
  }
  return sums;
}

void wire::PostedCapacity::after(int64_t n) {
  if (floor == 0) return;
  if (n > bytes && n <= kPostedMax) bytes = round_up(n);
  window_max = std::max(window_max, n);
  if (++window == kWindow) {
    if (window_max * 4 <= bytes) bytes = std::max(floor, round_up(window_max));
    window = 0, window_max = 0;
  }
}

int64_t wire::PostedCapacity::round_up(int64_t n) {
  int64_t p = 1;
  while (p * 2 <= n) p *= 2;
  const int64_t step = std::max<int64_t>(p / 8, 64);
  return (n + step - 1) / step * step;
}

int64_t wire::body_crc_word(const uint8_t* body, size_t n) {
  return kBodyCrcPresent | static_cast<int64_t>(crc32c(body, n));
}

namespace {

// Whether nothing but `t` itself refers to its memory: no other handle to its TensorImpl (a copy
// of the handle, e.g. a Message's body or a queued send) and no other tensor on its storage (a
// view, e.g. an inlined body narrowed from a frame).
bool unshared(const at::Tensor& t) { return t.defined() && t.use_count() == 1 && t.storage().use_count() == 1; }

// The memory of a Transport::message_buffer: the header's room, then the caller's body.
struct MessageBlock {
  void* memory = nullptr;
  std::atomic<bool> sending{false};  // a send of it is in flight: its header room is taken
};

void free_message_block(void* ctx) {
  auto* block = static_cast<MessageBlock*>(ctx);
  std::free(block->memory);
  delete block;
}

// The block of `body` when body is (a prefix of) a message_buffer's body, else null.
MessageBlock* message_block(const at::Tensor& body) {
  const c10::DataPtr& d = body.storage().data_ptr();
  if (d.get_deleter() != &free_message_block || body.storage_offset() != kHeaderBytes) return nullptr;
  return static_cast<MessageBlock*>(d.get_context());
}

// A buffer of `n` bytes from `pool` that nothing else refers to, or a new one kept in the pool
// (at most `keep`, replacing one still in use). Reuse saves the allocation and the page faults of
// touching fresh memory, and keeps the buffer warm in the caches.
at::Tensor pooled_buffer(
    std::vector<at::Tensor>& pool, int64_t n, size_t keep,
    at::Tensor (*make)(int64_t) = [](int64_t n) { return at::empty({n}, at::kByte); }) {
  for (const at::Tensor& t : pool)
    if (t.numel() == n && unshared(t)) return t;
  at::Tensor b = make(n);
  if (pool.size() < keep) {
    pool.push_back(b);
  } else {
    size_t i = 0;
    while (i + 1 < pool.size() && pool[i].numel() == n) ++i;  // replace another size first
    pool[i] = b;
  }
  return b;
}

// The first line of an exception's text, without c10's backtrace.
std::string cause_of(const std::exception& e) {
  std::string s;
  if (auto* c = dynamic_cast<const c10::Error*>(&e))
    s = c->what_without_backtrace();
  else
    s = e.what();
  const size_t nl = s.find('\n');
  if (nl != std::string::npos) s = s.substr(0, nl);
  return s;
}

std::string read_first_line(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  if (f) std::getline(f, line);
  return line;
}

std::string this_host() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "?";
  return buf;
}

// Whether process `pid` of this machine still runs (absent or zombie: no).
// The process's state letter from /proc/PID/stat ('R', 'S', 'T' stopped, 'Z' zombie, ...); 'X'
// when it is gone.
char process_state(int pid) {
  const std::string stat = read_first_line("/proc/" + std::to_string(pid) + "/stat");
  if (stat.empty()) return 'X';
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 2 >= stat.size()) return 'R';
  return stat[paren + 2];
}

bool process_alive(int pid) {
  const char state = process_state(pid);
  return state != 'Z' && state != 'X';
}

struct PeerInfo {
  int pid = 0;
  std::string boot_id;
  std::string host;
};

struct Pending {
  int dst;
  at::Tensor body;
  int64_t tag;
  int64_t seq;
  int64_t stamp_ns;
  std::string context;
  Corruption corrupt = Corruption::None;  // fault injection (corrupt_next_send, dist.corrupt_rate)
};

// A message whose frame and body sends are posted and not yet waited for.
struct InFlight {
  Pending p;
  at::Tensor frame;
  MessageBlock* block = nullptr;  // the frame is this message buffer (released once sent)
  compat::WorkPtr frame_work, body_work;
  std::vector<compat::WorkPtr> piece_work;  // Note [bodies in pieces]
  compat::WorkPtr trailer_work;
  at::Tensor trailer;
  double posted_s = 0.0;
};

// Note [communication thread]: how many messages its thread keeps posted at once.
constexpr size_t kSendWindow = 4;

}  // namespace

struct Transport::Impl {
  DistEnv env;
  TransportOptions opts;
  std::chrono::milliseconds timeout{60000};
  compat::StorePtr store;
  // Sends of a failed communication thread still posted in Gloo: kept (buffers alive) until the
  // process group is gone, which is destroyed before them (declared after).
  std::vector<InFlight> abandoned;
  compat::BackendPtr pg;
  bool cuda = false;
  at::Device device = at::kCPU;
  std::string boot_id;
  std::vector<PeerInfo> peers;
  std::vector<int64_t> send_seq, recv_seq;
  std::vector<std::unique_ptr<Link>> links;  // by source rank; null = ideal
  SteadyClock clock;
  // Note [pre-posted frames and reused buffers]: per source rank, the recv of its next frame
  // (posted as soon as the previous frame is read), the frame buffers it reuses, and the last
  // large body buffer; per destination, the frame buffers of the sends in flight.
  struct PostedFrame {
    std::vector<at::Tensor> tensors;
    compat::WorkPtr work;
    int64_t capacity = 0;  // body bytes it holds (Note [posted capacity])
  };
  std::vector<std::unique_ptr<PostedFrame>> posted;
  std::vector<PostedCapacity> send_capacity, recv_capacity;  // by destination, by source
  std::vector<std::vector<at::Tensor>> frame_pool;
  std::vector<at::Tensor> spare;
  std::vector<std::vector<at::Tensor>> send_pool;
  std::vector<at::Tensor> payload_pool;  // message buffers that send_payload serializes into

  std::mutex mutex;  // guards the queue, the error and the stats
  std::condition_variable wake, drained;
  std::deque<Pending> queue;
  bool stop = false;
  bool busy = false;
  std::exception_ptr error;
  std::thread thread;
  TransportStats stats;
  std::function<std::string(int)> rank_name;  // set_rank_names
  // Note [group sums in flight]: per group of ranks its process group (and, for more than two
  // members, a second one for the all-gathers), and the sums started, oldest first.
  struct Group {
    compat::BackendPtr sums, gathers;
  };
  std::map<std::vector<int>, Group> groups;
  struct GroupSum {
    std::vector<int> group;
    std::vector<at::Tensor> tensors;  // kept alive until waited for: the sum's, then (M > 2) the parts received
    compat::WorkPtr work;             // the all-reduce (M <= 2) or the parts' exchange
    std::vector<compat::WorkPtr> gathers;  // M > 2, once its parts are summed: the summed chunks' broadcasts
    bool summed = false;                   // M > 2: this member's chunk is summed, its gathers posted
    std::string context;
  };
  std::deque<GroupSum> group_sums;

  // Note [group sums of more than two in rank order]: the second phase of `sum` (waits for its
  // parts if they have not all arrived).
  void sum_parts_and_gather(GroupSum& sum) {
    const std::vector<int>& group = sum.group;
    const int M = static_cast<int>(group.size());
    const int me = static_cast<int>(std::find(group.begin(), group.end(), env.rank) - group.begin());
    const at::Tensor& flat = sum.tensors[0];
    const at::Tensor& parts = sum.tensors[1];  // (M * c_me): member e's chunk `me` at e * c_me
    const int64_t n = flat.numel();
    auto chunk = [&](int j) { return flat.narrow(0, n * j / M, n * (j + 1) / M - n * j / M); };
    collective("exchange of " + std::to_string(n) + " values' chunks over the group (reduce-scatter)", sum.context,
               [&] { return sum.work; }, group);
    at::Tensor own = chunk(me);
    const int64_t c = own.numel();
    if (c > 0) {
      at::add_out(own, parts.narrow(0, 0, c), parts.narrow(0, c, c));  // t_0 + t_1, then t_2, ...: rank order
      for (int e = 2; e < M; ++e) own.add_(parts.narrow(0, e * c, c));
    }
    const compat::BackendPtr& pg = groups.at(group).gathers;
    for (int j = 0; j < M; ++j) {
      std::vector<at::Tensor> v{chunk(j)};
      if (v[0].numel() == 0) continue;  // every member skips the same chunks
      c10d::BroadcastOptions o;
      o.rootRank = j;
      o.rootTensor = 0;
      o.timeout = timeout;
      sum.gathers.push_back(pg->broadcast(v, o));
    }
    sum.summed = true;
  }
  Corruption corrupt_next = Corruption::None;  // corrupt_next_send (under mutex)
  std::mt19937_64 corrupt_rng;                 // dist.corrupt_rate's draws (the sending thread's)

  // ---- errors --------------------------------------------------------------------------------
  // Note [who stalled the run]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~
  // A rank that dies closes its sockets and its peers see it at once. A rank that stalls (SIGSTOP,
  // a debugger, a swapped-out machine) is seen only by timeouts, and not always by its own peers
  // first: in a 2 x 2 grid with rank 2 stopped, rank 0 waits for rank 2, rank 1 waits for rank 0 in
  // the data-parallel sum, and rank 3 waits for rank 1's next forward. All three time out
  // dist.timeout_s after their wait began, in any order, and rank 3's peer is running. So when a
  // timed-out peer still runs, the message also names every rank of this machine that is stopped
  // or gone ("meanwhile rank 2 (pid ..) is stopped"); they are the error's suspects, and the
  // runtime says where each sits in the grid. Ranks on other machines cannot be seen from here.
  // "peer 2 (pid 123) has exited" / "is stopped" / "is still running" / "" when not on this machine.
  // With wait_s > 0, a process that still exists is given that long to finish exiting (its sockets
  // close before it is gone).
  std::string liveness(int peer, double wait_s = 0.0) const {
    if (peer < 0 || peer >= static_cast<int>(peers.size())) return "";
    const PeerInfo& p = peers[peer];
    if (p.pid <= 0 || p.boot_id.empty() || p.boot_id != boot_id) return "";
    bool alive = process_alive(p.pid);
    for (const double end = steady_now_s() + wait_s; alive && steady_now_s() < end;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      alive = process_alive(p.pid);
    }
    const char state = alive ? process_state(p.pid) : 'X';
    return "rank " + std::to_string(peer) + " (pid " + std::to_string(p.pid) + ") " +
           (!alive                          ? "has exited"
            : state == 'T' || state == 't' ? "is stopped (SIGSTOP or a debugger: it cannot answer)"
                                           : "is still running");
  }

  TransportError failure(const std::string& what, int peer, const std::string& context, const std::string& cause) {
    std::ostringstream os;
    os << "rank " << env.rank << ": " << what << " (" << context << ") failed: ";
    const bool timed_out = cause.find("imed out") != std::string::npos || cause.find("imeout") != std::string::npos;
    const bool closed = cause.find("losed") != std::string::npos || cause.find("reset") != std::string::npos ||
                        cause.find("Broken pipe") != std::string::npos || cause.find("EOF") != std::string::npos;
    if (timed_out)
      os << "no answer within " << opts.timeout_s << " s (dist.timeout_s)";
    else if (closed && peer >= 0)
      os << "rank " << peer << " closed the connection (it died or exited)";
    else
      os << "communication error";
    std::vector<int> suspects;
    auto stuck = [](const std::string& alive) { return alive.find("is still running") == std::string::npos; };
    if (peer >= 0) {
      const std::string alive = liveness(peer, closed ? 1.0 : 0.0);
      if (!alive.empty()) os << "; " << alive;
      // Note [who stalled the run]: a peer that runs but does not answer may itself be waiting.
      if (timed_out && !alive.empty() && !stuck(alive)) {
        for (int r = 0; r < env.world_size && suspects.size() < 8; ++r) {
          if (r == env.rank || r == peer) continue;
          const std::string other = liveness(r);
          if (!other.empty() && stuck(other)) os << "; meanwhile " << other, suspects.push_back(r);
        }
      }
    } else {
      // A collective: say what became of the other ranks of this machine (the first 8).
      for (int r = 0, n = 0; r < env.world_size && n < 8; ++r) {
        if (r == env.rank) continue;
        const std::string alive = liveness(r, closed ? 0.2 : 0.0);
        if (alive.empty()) continue;
        os << "; " << alive, ++n;
        if (stuck(alive)) suspects.push_back(r);
      }
    }
    os << " [c10d: " << cause << "]";
    if (rank_name) {  // where the ranks named sit in the run (a collective: any may be at fault)
      auto place = [&](int r) { return "rank " + std::to_string(r) + " = " + rank_name(r); };
      os << " [";
      if (peer >= 0) {
        os << place(peer) << "; ";
        for (int r : suspects) os << place(r) << "; ";
      } else if (env.world_size <= 16) {
        for (int r = 0; r < env.world_size; ++r)
          if (r != env.rank) os << place(r) << "; ";
      }
      os << "this is " << place(env.rank) << "]";
    }
    return TransportError(os.str(), peer, context, std::move(suspects));
  }

  // Records the first error; the transport is broken from then on.
  void record(std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!error) error = e;
  }

  // Throws the recorded error, if any, saying where it surfaced.
  void check_ok(const std::string& context) {
    std::exception_ptr e;
    {
      std::lock_guard<std::mutex> lock(mutex);
      e = error;
    }
    if (!e) return;
    try {
      std::rethrow_exception(e);
    } catch (const TransportError& t) {
      if (t.context() == context) throw;
      throw TransportError(std::string(t.what()) + " (reported at: " + context + ")", t.peer(), t.context(),
                           t.suspects());
    }
  }

  void check_peer(int peer, const char* what) const {
    TORCH_CHECK(peer >= 0 && peer < env.world_size && peer != env.rank, "rank ", env.rank, ": cannot ", what, " rank ",
                peer, ": accepted ranks are 0..", env.world_size - 1, " other than this one");
  }

  at::Tensor on_device(const at::Tensor& t) const { return cuda ? t.to(device) : t; }

  // ---- messages -------------------------------------------------------------------------------
  // Posts the frame and (for a body beyond the posted capacity) the body of `p`, without waiting
  // for either; a body in pieces is summed while its pieces travel, then its trailer is posted.
  InFlight post_send(Pending p) {
    // Note [wire protocol]: the frame is the header, followed by the body unless it is separate
    // or in pieces (Note [bodies in pieces]: those leave the posted capacity as it is).
    const int64_t n = p.body.numel();
    const bool sum = opts.checksum && !cuda;
    const int64_t pieces =
        sum && opts.pieces_min_bytes > 0 && n >= opts.pieces_min_bytes ? piece_count(n, opts.piece_bytes) : 0;
    PostedCapacity& capacity = send_capacity[p.dst];
    const bool separate = !pieces && capacity.separate(n);
    if (!pieces) capacity.after(n);
    InFlight f;
    f.posted_s = steady_now_s();
    if (p.corrupt == Corruption::None && opts.corrupt_rate > 0 &&
        std::uniform_real_distribution<double>(0.0, 1.0)(corrupt_rng) < opts.corrupt_rate)
      p.corrupt = Corruption::BitFlip;  // dist.corrupt_rate (the soak)
    if (p.corrupt == Corruption::Trailer && !pieces) p.corrupt = Corruption::BitFlip;  // no trailer
    int64_t h[kHeaderWords];
    h[kWordMagic] = kMagic;
    h[kWordSeq] = p.seq;
    h[kWordTag] = p.tag;
    h[kWordBytes] = n;
    h[kWordStamp] = p.stamp_ns;
    h[kWordLayout] = pieces     ? kLayoutPieces | (pieces << kPieceCountShift)
                     : separate ? kLayoutSeparate
                                : kLayoutInFrame;
    const uint8_t* src = n > 0 ? p.body.data_ptr<uint8_t>() : nullptr;
    // A message buffer no other send uses is the frame itself (never for a corrupted message: the
    // caller's bytes stay as they are).
    MessageBlock* block = separate || pieces || p.corrupt != Corruption::None ? nullptr : message_block(p.body);
    if (block && block->sending.exchange(true)) block = nullptr;
    at::Tensor body;  // a separate body, or the body in pieces
    if (block) {
      f.block = block;
      f.frame = at::empty({0}, at::kByte).set_(p.body.storage(), 0, {kHeaderBytes + n}, {1});
      h[kWordBodyCrc] = sum ? body_crc_word(src, static_cast<size_t>(n)) : 0;
    } else if (!separate && !pieces) {
      // A frame buffer of this destination that no send in flight uses, of this size class; the
      // body is copied into it and summed in one pass (checksum.h's crc32c_copy).
      const int64_t room = std::max(kInlineMax, PostedCapacity::round_up(n));
      f.frame = pooled_buffer(send_pool[p.dst], kHeaderBytes + room, kSendWindow + 1).narrow(0, 0, kHeaderBytes + n);
      uint8_t* w = f.frame.data_ptr<uint8_t>() + kHeaderBytes;
      if (sum)
        h[kWordBodyCrc] = kBodyCrcPresent | crc32c_copy(w, src, static_cast<size_t>(n));
      else if (n > 0)
        std::memcpy(w, src, static_cast<size_t>(n)), h[kWordBodyCrc] = 0;
      else
        h[kWordBodyCrc] = 0;
    } else {
      f.frame = pooled_buffer(send_pool[p.dst], kHeaderBytes + kInlineMax, kSendWindow + 1).narrow(0, 0, kHeaderBytes);
      body = p.body;
      // A body in pieces is summed below, while it travels; its sums follow in the trailer.
      h[kWordBodyCrc] = pieces ? kBodyCrcPresent : sum ? body_crc_word(src, static_cast<size_t>(n)) : 0;
    }
    const bool flip_header = p.corrupt != Corruption::None && corrupt(p, h, f.frame, body, separate, pieces);
    h[kWordCheck] = check_word(h);
    if (flip_header) h[kWordSeq] ^= int64_t(1) << 7;
    std::memcpy(f.frame.data_ptr<uint8_t>(), h, kHeaderBytes);
    const bool send_body = p.corrupt != Corruption::Oversize;
    try {
      // Both sends are posted before waiting for either: the body's announcement travels right
      // behind the frame, and the receiver can take the body as soon as it has read the header.
      std::vector<at::Tensor> hv{on_device(f.frame)};
      f.frame_work = pg->send(hv, p.dst, kFrameTag);
      if (separate && send_body) {
        std::vector<at::Tensor> bv{on_device(body)};
        f.body_work = pg->send(bv, p.dst, kBodyTag);
      }
      for (int64_t k = 0; send_body && k < pieces; ++k) {
        const PieceSpan s = piece_span(n, pieces, k);  // (of a truncated body, what is left of it)
        std::vector<at::Tensor> pv{body.narrow(0, s.offset, std::clamp<int64_t>(body.numel() - s.offset, 0, s.bytes))};
        f.piece_work.push_back(pg->send(pv, p.dst, kPieceTag));
      }
    } catch (const std::exception& e) {
      throw send_failure(p, e);
    }
    if (pieces && send_body) {
      // Gloo's thread moves the pieces meanwhile. The sums are of the caller's bytes (a corrupted
      // body is a copy, or shorter).
      std::vector<uint32_t> sums(static_cast<size_t>(pieces));
      for (int64_t k = 0; k < pieces; ++k) {
        const PieceSpan s = piece_span(n, pieces, k);
        sums[static_cast<size_t>(k)] = crc32c(src + s.offset, static_cast<size_t>(s.bytes));
      }
      const std::vector<int64_t> words = make_trailer(p.seq, sums);
      f.trailer = at::empty({static_cast<int64_t>(words.size()) * 8}, at::kByte);
      std::memcpy(f.trailer.data_ptr<uint8_t>(), words.data(), words.size() * 8);
      if (p.corrupt == Corruption::Trailer) f.trailer.data_ptr<uint8_t>()[3 * 8] ^= 1;  // piece 0's sum
      try {
        std::vector<at::Tensor> tv{f.trailer};
        f.trailer_work = pg->send(tv, p.dst, kTrailerTag);
      } catch (const std::exception& e) {
        throw send_failure(p, e);
      }
    }
    f.p = std::move(p);
    return f;
  }

  // Fault injection (Note [fault injection] in parallel/ranks/fault.h), after the checksum was
  // taken: `h` (the header, check word not yet set), `frame` (header + a copy of the body) and
  // `body` (a separate body, or one in `pieces`) are changed; p.body, the caller's bytes, never
  // is. Returns whether a bit of the header is to be flipped once its check word is set (a bit
  // flip of an empty body).
  bool corrupt(const Pending& p, int64_t* h, at::Tensor& frame, at::Tensor& body, bool separate, int64_t pieces) {
    bool flip_header = false;
    const int64_t n = p.body.numel();
    const bool own_body = separate || pieces;  // the body is not in the frame
    std::ostringstream os;
    os << "rank " << env.rank << ": message #" << p.seq << " to rank " << p.dst << " (" << p.context << ", " << n
       << " bytes" << (pieces ? ", in " + std::to_string(pieces) + " pieces" : std::string()) << ") ";
    switch (p.corrupt) {
      case Corruption::Truncate: {
        // Half of the body; of a body in pieces, half of its last piece (every piece is sent).
        const int64_t cut = pieces ? n - piece_span(n, pieces, pieces - 1).bytes / 2 : n / 2;
        if (own_body)
          body = p.body.narrow(0, 0, cut);
        else
          frame = frame.narrow(0, 0, kHeaderBytes + cut);
        os << "cut to " << cut << " bytes after its checksum";
        break;
      }
      case Corruption::BitFlip: {
        if (n == 0) {  // no body: a bit of the header
          flip_header = true;
          os << "had bit 7 of its sequence number flipped after its check word";
          break;
        }
        const int64_t byte = static_cast<int64_t>(corrupt_rng() % static_cast<uint64_t>(n));
        const int bit = static_cast<int>(corrupt_rng() % 8);
        if (own_body) body = p.body.clone();
        (own_body ? body.data_ptr<uint8_t>() : frame.data_ptr<uint8_t>() + kHeaderBytes)[byte] ^=
            static_cast<uint8_t>(1u << bit);
        os << "had bit " << bit << " of byte " << byte << " flipped after its checksum";
        break;
      }
      case Corruption::Oversize:
        h[kWordBytes] = int64_t(1) << 60;
        frame = frame.narrow(0, 0, kHeaderBytes);
        os << "announced as " << h[kWordBytes] << " bytes, and its body not sent";
        break;
      case Corruption::Trailer:
        os << "had bit 0 of piece 0's sum in its trailer flipped after the trailer's check word";
        break;
      case Corruption::None:
        return false;
    }
    std::cerr << os.str() << " (fault injection)" << std::endl;
    return flip_header;
  }

  // Waits until the sends of `f` are complete; counts the message.
  void finish_send(InFlight& f, double since) {
    try {
      compat::wait(f.frame_work, timeout);
      if (f.body_work) compat::wait(f.body_work, timeout);
      for (const compat::WorkPtr& w : f.piece_work) compat::wait(w, timeout);
      if (f.trailer_work) compat::wait(f.trailer_work, timeout);
    } catch (const TransportError&) {
      throw;
    } catch (const std::exception& e) {
      throw send_failure(f.p, e);
    }
    if (f.block) f.block->sending = false;  // (a failed send keeps it: Gloo may still read it)
    std::lock_guard<std::mutex> lock(mutex);
    stats.send_s += steady_now_s() - since;
    stats.bytes_sent += f.p.body.numel();
    stats.messages_sent += 1;
    stats.sent_in_pieces += f.piece_work.empty() ? 0 : 1;
  }

  TransportError send_failure(const Pending& p, const std::exception& e) {
    return failure("send of message #" + std::to_string(p.seq) + " (" + std::to_string(p.body.numel()) +
                       " bytes) to rank " + std::to_string(p.dst),
                   p.dst, p.context, cause_of(e));
  }

  Corruption take_corruption() {
    std::lock_guard<std::mutex> lock(mutex);
    return std::exchange(corrupt_next, Corruption::None);
  }

  // A blocking send (the caller's thread).
  void do_send(Pending p) {
    InFlight f = post_send(std::move(p));
    finish_send(f, f.posted_s);
  }

  void send(int dst, at::Tensor body, int64_t tag, const std::string& context) {
    check_ok(context);
    check_peer(dst, "send to");
    TORCH_CHECK(body.scalar_type() == at::kByte && body.dim() == 1 && body.is_contiguous() && body.device().is_cpu(),
                "rank ", env.rank, ": send to rank ", dst, " (", context,
                "): the body must be a 1-D contiguous uint8 CPU tensor, got ", body.toString(), " ", body.sizes());
    Pending p{dst, std::move(body), tag, send_seq[dst]++, steady_now_ns(), context, take_corruption()};
    if (!opts.comm_thread) {
      try {
        do_send(std::move(p));
      } catch (...) {
        record(std::current_exception());
        throw;
      }
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mutex);
      queue.push_back(std::move(p));
    }
    wake.notify_one();
  }

  // Note [communication thread]. The thread keeps up to kSendWindow messages posted: it posts the
  // next queued message before waiting for the ones before it, so that a frame is on the wire
  // when the receiver looks for it, and the receiver's recv-ready notice finds the send already
  // posted (no wake-up of this thread on the path of a message). It waits for the oldest message
  // when the window is full or nothing else is queued. Gloo keeps the order of the sends to one
  // rank; posting a send earlier never makes any rank wait longer.
  void comm_loop() {
    std::deque<InFlight> inflight;
    for (;;) {
      Pending p;
      bool post = false;
      {
        std::unique_lock<std::mutex> lock(mutex);
        if (inflight.empty()) wake.wait(lock, [&] { return stop || !queue.empty(); });
        if (!queue.empty() && inflight.size() < kSendWindow) {
          p = std::move(queue.front());
          queue.pop_front();
          busy = post = true;
        } else if (inflight.empty()) {
          return;  // stopped, nothing queued
        }
      }
      std::exception_ptr err;
      try {
        if (post) {
          inflight.push_back(post_send(std::move(p)));
          continue;
        }
        finish_send(inflight.front(), steady_now_s());  // send_s: the time this thread is blocked
        inflight.pop_front();
      } catch (...) {
        err = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(mutex);
        if (err) {
          if (!error) error = err;
          queue.clear();  // later messages would only pile up behind a broken link
          for (InFlight& f : inflight) abandoned.push_back(std::move(f));
          inflight.clear();
        }
        busy = !inflight.empty();
      }
      drained.notify_all();
    }
  }

  void flush(const std::string& context) {
    if (opts.comm_thread) {
      std::unique_lock<std::mutex> lock(mutex);
      drained.wait(lock, [&] { return (queue.empty() && !busy) || error; });
    }
    check_ok(context);
  }

  Message recv(int src, std::optional<int64_t> expected_tag, const std::string& context) {
    check_ok(context);
    check_peer(src, "receive from");
    Message m;
    m.src = src;
    const double t0 = steady_now_s();
    const std::string what =
        "receive of message #" + std::to_string(recv_seq[src]) + " from rank " + std::to_string(src);
    auto fail = [&](const std::string& why) {
      TransportError e("rank " + std::to_string(env.rank) + ": " + what + " (" + context + "): " + why, src, context);
      record(std::make_exception_ptr(e));
      throw e;
    };
    at::Tensor frame;
    double t_header = 0.0;
    int64_t capacity = 0;  // of the frame recv (Note [posted capacity])
    try {
      std::unique_ptr<PostedFrame> pf = std::move(posted[src]);
      if (!pf) pf = post_frame(src);
      capacity = pf->capacity;
      compat::wait(pf->work, timeout);
      frame = pf->tensors[0].cpu();
      t_header = steady_now_s();
    } catch (const std::exception& e) {
      TransportError err = failure(what, src, context, cause_of(e));
      record(std::make_exception_ptr(err));
      throw err;
    }
    FrameHeader h;
    try {
      h = parse_frame_header(frame.data_ptr<uint8_t>(), static_cast<size_t>(frame.numel()), recv_seq[src],
                             expected_tag ? &*expected_tag : nullptr, opts.max_message_bytes);
    } catch (const std::runtime_error& e) {
      fail(e.what());
    }
    const int64_t n = h.body_bytes;
    const int64_t pieces = h.pieces;  // Note [bodies in pieces]: they leave the capacity as it is
    const bool separate = !pieces && n > capacity;
    if (!pieces && h.layout != (separate ? kLayoutSeparate : kLayoutInFrame))
      fail("its header says the body " + std::string(separate ? "is in the frame" : "follows on its own") +
           ", but this rank posted room for " + std::to_string(capacity) + " body bytes: the two ranks disagree " +
           "about the posted capacity (Note [posted capacity]; another version of tapeline at the other end?)");
    if (!pieces) recv_capacity[src].after(n);
    m.tag = h.tag;
    m.seq = h.seq;
    m.sent_s = steady_ns_to_s(h.stamp_ns);
    std::vector<uint32_t> sums;  // of the pieces, as they arrived
    at::Tensor trailer;
    std::string part = "body of " + std::to_string(n) + " bytes";  // what a failed wait was for
    try {
      // The body's recv is posted first (its recv-ready notice is what the sender waits for), then
      // the next frame's, which can land while this body does and before recv() is called again.
      // A body in pieces: every piece's recv and the trailer's, then piece k is summed as soon as
      // it is in, while the next ones arrive.
      at::Tensor body;
      compat::WorkPtr body_work, trailer_work;
      std::vector<compat::WorkPtr> piece_work;
      std::vector<at::Tensor> bv;
      if (pieces) {
        body = body_buffer(src, n);
        for (int64_t k = 0; k < pieces; ++k) {
          const PieceSpan s = piece_span(n, pieces, k);
          std::vector<at::Tensor> pv{body.narrow(0, s.offset, s.bytes)};
          piece_work.push_back(pg->recv(pv, src, kPieceTag));
        }
        trailer = at::empty({trailer_words(pieces) * 8}, at::kByte);
        std::vector<at::Tensor> tv{trailer};
        trailer_work = pg->recv(tv, src, kTrailerTag);
      } else if (!separate) {
        body = frame.narrow(0, kHeaderBytes, n);  // came in the frame
      } else {
        body = body_buffer(src, n);
        bv = {on_device(body)};
        body_work = pg->recv(bv, src, kBodyTag);
      }
      if (!cuda) posted[src] = post_frame(src);
      if (body_work) {
        compat::wait(body_work, timeout);
        if (cuda) body = bv[0].cpu();
      }
      for (int64_t k = 0; k < pieces; ++k) {
        const PieceSpan s = piece_span(n, pieces, k);
        part = "piece " + std::to_string(k) + " of " + std::to_string(pieces) + " of a body of " + std::to_string(n) +
               " bytes";
        compat::wait(piece_work[static_cast<size_t>(k)], timeout);
        sums.push_back(crc32c(body.data_ptr<uint8_t>() + s.offset, static_cast<size_t>(s.bytes)));
      }
      if (trailer_work) {
        part = "trailer of a body of " + std::to_string(n) + " bytes in " + std::to_string(pieces) + " pieces";
        compat::wait(trailer_work, timeout);
      }
      m.body = body;
    } catch (const std::exception& e) {
      TransportError err = failure(what + " (" + part + ")", src, context, cause_of(e));
      record(std::make_exception_ptr(err));
      throw err;
    }
    if (pieces) {  // Note [bodies in pieces]
      std::vector<uint32_t> want;
      try {
        want = parse_trailer(trailer.data_ptr<uint8_t>(), static_cast<size_t>(trailer.numel()), h.seq, pieces);
      } catch (const std::runtime_error& e) {
        fail(e.what());
      }
      for (int64_t k = 0; k < pieces; ++k) {
        if (sums[static_cast<size_t>(k)] == want[static_cast<size_t>(k)]) continue;
        const PieceSpan s = piece_span(n, pieces, k);
        std::ostringstream os;
        os << "body checksum mismatch in piece " << k << " of " << pieces << " (bytes "
           << s.offset << ".." << s.offset + s.bytes << " of " << n << "; crc32c 0x" << std::hex
           << sums[static_cast<size_t>(k)] << ", the sender's 0x" << want[static_cast<size_t>(k)] << std::dec
           << "): the message was corrupted or cut short between the two ranks; nothing of it was used";
        fail(os.str());
      }
    } else if (h.body_crc != 0) {  // Note [body checksum]
      const int64_t got = body_crc_word(m.body.data_ptr<uint8_t>(), static_cast<size_t>(n));
      if (got != h.body_crc) {
        std::ostringstream os;
        os << std::hex << "body checksum mismatch (crc32c 0x" << (got & 0xFFFFFFFF) << ", the sender's 0x"
           << (h.body_crc & 0xFFFFFFFF) << std::dec << ", " << n
           << " bytes): the message was corrupted or cut short between the two ranks; nothing of it was used";
        fail(os.str());
      }
    }
    const double t_body = steady_now_s();
    ++recv_seq[src];
    m.transfer_s = separate || pieces ? t_body - t_header : 0.0;
    if (links[src] && m.tag >= 0 && !(m.tag & kTagNoLink)) {  // pipeline messages only, not gather_bytes
      // Note [link emulation at the receiver].
      const bool same_clock = !peers[src].boot_id.empty() && peers[src].boot_id == boot_id;
      m.link_s = wait_for_delivery(*links[src], clock, same_clock ? m.sent_s : t_header, n);
    }
    m.wait_s = steady_now_s() - t0;
    std::lock_guard<std::mutex> lock(mutex);
    stats.messages_received += 1;
    stats.bytes_received += n;
    stats.recv_wait_s += m.wait_s;
    stats.link_s += m.link_s;
    return m;
  }

  // Posts the recv of src's next frame, with room for the posted capacity (Gloo accepts a shorter
  // message into a larger recv; NCCL does not, hence a capacity of 0 there).
  std::unique_ptr<PostedFrame> post_frame(int src) {
    auto pf = std::make_unique<PostedFrame>();
    pf->capacity = recv_capacity[src].bytes;
    const int64_t size = kHeaderBytes + pf->capacity;
    pf->tensors = {cuda ? on_device(at::empty({size}, at::kByte)) : pooled_buffer(frame_pool[src], size, 3)};
    pf->work = pg->recv(pf->tensors, src, kFrameTag);
    return pf;
  }

  // A body buffer of n bytes: the spare one of this source if nobody else holds it and it is about
  // the right size, else a new one (kept as the spare when large).
  at::Tensor body_buffer(int src, int64_t n) {
    constexpr int64_t kMinSpare = 256 << 10;
    at::Tensor& s = spare[src];
    if (n >= kMinSpare && unshared(s) && s.numel() >= n && s.numel() <= 2 * n)
      return s.numel() == n ? s : s.narrow(0, 0, n);
    at::Tensor b = at::empty({n}, at::kByte);
    if (n >= kMinSpare) s = b;
    return b;
  }

  // Runs a collective; errors name the ranks of this machine that are gone. `members`: the ranks
  // taking part (empty: every rank).
  void collective(const std::string& what, const std::string& context, const std::function<compat::WorkPtr()>& op,
                  const std::vector<int>& members = {}) {
    try {
      compat::wait(op(), timeout);
    } catch (const std::exception& e) {
      std::vector<int> others;
      for (int r = 0; r < env.world_size; ++r)
        if (r != env.rank && (members.empty() || std::find(members.begin(), members.end(), r) != members.end()))
          others.push_back(r);
      // The peer at fault: the single member that has exited, or the other member of two.
      int dead = -1, count = 0;
      for (int r : others)
        if (liveness(r).find("has exited") != std::string::npos) dead = r, ++count;
      const int peer = count == 1 ? dead : (count == 0 && others.size() == 1 ? others[0] : -1);
      TransportError err = failure(what, members.empty() ? -1 : peer, context, cause_of(e));
      TransportError named(err.what(), peer, context, err.suspects());
      record(std::make_exception_ptr(named));
      throw named;
    }
  }
};

// ---- Transport ------------------------------------------------------------------------------------

bool Transport::available(const std::string& backend) {
  if (backend == "gloo") return compat::has_gloo();
  if (backend == "nccl") return compat::has_nccl();
  return false;
}

std::unique_ptr<Transport> Transport::connect(const DistEnv& env, const TransportOptions& options) {
  TORCH_CHECK(options.backend == "gloo" || options.backend == "nccl", "transport: unknown backend '", options.backend,
              "'; known: gloo, nccl");
  TORCH_CHECK(options.timeout_s > 0, "transport: dist.timeout_s must be > 0, got ", options.timeout_s);
  TORCH_CHECK(env.world_size >= 1 && env.rank >= 0 && env.rank < env.world_size, "transport: invalid ", env.describe());
  auto impl = std::make_unique<Impl>();
  impl->env = env;
  impl->opts = options;
  impl->corrupt_rng.seed(options.corrupt_seed * 1000003u + static_cast<uint64_t>(env.rank));
  impl->timeout = std::chrono::milliseconds(static_cast<int64_t>(options.timeout_s * 1000.0));
  impl->cuda = options.backend == "nccl";
  if (impl->cuda) {
    // Note [one device per NCCL rank]: NCCL refuses two ranks of one communicator on one device
    // ("Duplicate GPU detected"), so ranks wrap round the devices (cuda_device_for) only with Gloo.
    const int devices = at::detail::getCUDAHooks().getNumGPUs();
    TORCH_CHECK(devices >= env.local_world_size, "rank ", env.rank, ": backend nccl needs one CUDA device per rank on ",
                "this machine, but ", env.local_world_size, " ranks share ", devices,
                " device(s); start at most that many ranks per machine, or use run.device = cpu (Gloo)");
    impl->device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(cuda_device_for(env.local_rank, devices)));
  }
  impl->boot_id = read_first_line("/proc/sys/kernel/random/boot_id");
  const std::string where = "rank " + std::to_string(env.rank) + " of " + std::to_string(env.world_size);

  // The store: rank 0 hosts it unless torchrun's agent already does.
  compat::StorePtr tcp;
  try {
    tcp = compat::make_tcp_store(env.master_addr, env.master_port, !env.agent_store && env.rank == 0, env.world_size,
                                 impl->timeout);
  } catch (const std::exception& e) {
    std::ostringstream os;
    os << where << ": cannot reach the TCPStore at " << env.master_addr << ":" << env.master_port << " ("
       << (env.agent_store ? "hosted by the launcher's agent"
           : env.rank == 0 ? "to be hosted here"
                           : "hosted by rank 0")
       << ") within " << options.timeout_s << " s: " << cause_of(e);
    throw TransportError(os.str(), env.agent_store || env.rank == 0 ? -1 : 0, "connect");
  }
  impl->store = compat::make_prefix_store(env.store_prefix(), tcp);

  // Who is who (for liveness checks and clocks), then the process group.
  const std::string info = std::to_string(::getpid()) + " " + impl->boot_id + " " + this_host();
  impl->store->set("info/" + std::to_string(env.rank), std::vector<uint8_t>(info.begin(), info.end()));
  try {
    auto pg_store = compat::make_prefix_store("pg", impl->store);
    impl->pg = impl->cuda ? compat::make_nccl(pg_store, env.rank, env.world_size, impl->timeout)
                          : compat::make_gloo(pg_store, env.rank, env.world_size, impl->timeout, env.master_addr);
  } catch (const std::exception& e) {
    // Who never registered?
    std::string missing;
    int missing_rank = -1, count = 0;
    for (int r = 0; r < env.world_size; ++r) {
      bool there = false;
      try {
        there = impl->store->check({"info/" + std::to_string(r)});
      } catch (const std::exception&) {
      }
      if (!there) {
        missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        missing_rank = r;
        ++count;
      }
    }
    std::ostringstream os;
    os << where << ": rendezvous of the " << options.backend << " process group failed within " << options.timeout_s
       << " s (" << env.describe() << "): ";
    if (count > 0)
      os << (count == 1 ? "rank " : "ranks ") << missing << (count == 1 ? " did" : " did") << " not arrive";
    else
      os << "every rank registered, but connecting them failed";
    os << " [c10d: " << cause_of(e) << "]";
    throw TransportError(os.str(), count == 1 ? missing_rank : -1, "connect");
  }
  impl->peers.resize(env.world_size);
  for (int r = 0; r < env.world_size; ++r) {
    const std::vector<uint8_t> v = impl->store->get("info/" + std::to_string(r));
    std::istringstream is(std::string(v.begin(), v.end()));
    is >> impl->peers[r].pid >> impl->peers[r].boot_id >> impl->peers[r].host;
  }
  impl->posted.resize(env.world_size);
  impl->frame_pool.resize(env.world_size);
  impl->spare.resize(env.world_size);
  impl->send_pool.resize(env.world_size);
  impl->send_capacity.assign(env.world_size, PostedCapacity(impl->cuda ? 0 : kInlineMax));
  impl->recv_capacity = impl->send_capacity;
  impl->send_seq.assign(env.world_size, 0);
  impl->recv_seq.assign(env.world_size, 0);
  impl->links.resize(env.world_size);
  for (int r = 0; r < env.world_size; ++r) {
    auto it = options.link_from.find(r);
    const LinkSpec spec = it != options.link_from.end() ? it->second : options.link;
    if (!spec.is_ideal()) impl->links[r] = std::make_unique<Link>(spec);
  }
  // Nobody leaves before everyone has read the store (rank 0 may host it).
  impl->collective("barrier after connecting", "connect", [&] {
    c10d::BarrierOptions o;
    o.timeout = impl->timeout;
    return impl->pg->barrier(o);
  });
  if (options.comm_thread) {
    Impl* p = impl.get();
    impl->thread = std::thread([p] { p->comm_loop(); });
  }
  return std::unique_ptr<Transport>(new Transport(std::move(impl)));
}

Transport::Transport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Transport::~Transport() {
  if (impl_->thread.joinable()) {
    {
      std::lock_guard<std::mutex> lock(impl_->mutex);
      impl_->stop = true;
    }
    impl_->wake.notify_all();
    impl_->thread.join();  // sends what is queued (each bounded by the timeout) and exits
  }
}

int Transport::rank() const { return impl_->env.rank; }
void Transport::set_rank_names(std::function<std::string(int)> name) { impl_->rank_name = std::move(name); }
int Transport::world_size() const { return impl_->env.world_size; }
const DistEnv& Transport::env() const { return impl_->env; }

at::Tensor Transport::message_buffer(int64_t n) {
  TORCH_CHECK(n >= 0, "transport: a message buffer of ", n, " bytes; accepted: 0 or more");
  const size_t bytes = static_cast<size_t>(kHeaderBytes + n);
  void* memory = nullptr;
  TORCH_CHECK(::posix_memalign(&memory, 64, bytes) == 0, "transport: cannot allocate a message buffer of ", n,
              " bytes");
  auto* block = new MessageBlock;
  block->memory = memory;
  c10::Storage storage(c10::Storage::use_byte_size_t(), bytes,
                       c10::DataPtr(memory, block, &free_message_block, at::kCPU), nullptr, false);
  return at::empty({0}, at::kByte).set_(storage, kHeaderBytes, {n}, {1});
}

void Transport::send(int dst, const at::Tensor& body, int64_t tag, const std::string& context) {
  TORCH_CHECK(tag >= 0, "transport: message tags are >= 0, got ", tag, " (", context, ")");
  impl_->send(dst, body, tag, context);
}

void Transport::send(int dst, std::vector<uint8_t>&& bytes, int64_t tag, const std::string& context) {
  TORCH_CHECK(tag >= 0, "transport: message tags are >= 0, got ", tag, " (", context, ")");
  auto owner = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
  const int64_t n = static_cast<int64_t>(owner->size());
  at::Tensor t = n == 0 ? at::empty({0}, at::kByte)
                        : at::from_blob(
                              owner->data(), {n}, [owner](void*) mutable { owner.reset(); }, at::kByte);
  impl_->send(dst, std::move(t), tag, context);
}

void Transport::send_payload(int dst, const Payload& payload, int64_t tag, const std::string& context) {
  // Serialized straight into a message buffer, which is then the frame (Note [posted capacity]).
  const int64_t n = static_cast<int64_t>(payload.nbytes());
  at::Tensor buffer = pooled_buffer(impl_->payload_pool, std::max(kInlineMax, PostedCapacity::round_up(n)),
                                    kSendWindow + 2, &Transport::message_buffer)
                          .narrow(0, 0, n);
  payload.serialize_into(buffer.data_ptr<uint8_t>());
  send(dst, buffer, tag, context);
}

Message Transport::recv(int src, int64_t expected_tag, const std::string& context) {
  std::optional<int64_t> want;
  if (expected_tag >= 0) want = expected_tag;
  return impl_->recv(src, want, context);
}

Payload Transport::recv_payload(int src, int64_t expected_tag, const std::string& context, at::Device device,
                                Message* info) {
  Message m = recv(src, expected_tag, context);
  Payload p;
  try {
    // Note [pre-posted frames and reused buffers]: a large body is not copied out of a frame about
    // its size (a held payload keeps its frame).
    constexpr size_t kViewMin = 256 << 10;
    const bool view =
        device.is_cpu() && m.size() >= kViewMin && m.body.storage().nbytes() <= 2 * (m.size() + kHeaderBytes);
    p = view ? Payload::deserialize_view(m.body, 0, m.size()) : Payload::deserialize(m.data(), m.size(), device);
  } catch (const std::exception& e) {
    TransportError err("rank " + std::to_string(rank()) + ": message #" + std::to_string(m.seq) + " from rank " +
                           std::to_string(src) + " (" + context + ", " + std::to_string(m.size()) +
                           " bytes) is not a valid payload: " + cause_of(e),
                       src, context);
    impl_->record(std::make_exception_ptr(err));
    throw err;
  }
  if (info) *info = std::move(m);
  return p;
}

void Transport::flush(const std::string& context) { impl_->flush(context); }

void Transport::all_reduce_sum(at::Tensor& tensor, const std::string& context) {
  impl_->check_ok(context);
  TORCH_CHECK(tensor.is_contiguous() && (impl_->cuda ? tensor.is_cuda() : tensor.device().is_cpu()), "rank ", rank(),
              ": all_reduce_sum (", context, ") needs a contiguous ", impl_->cuda ? "CUDA" : "CPU", " tensor, got ",
              tensor.toString());
  std::vector<at::Tensor> v{tensor};
  impl_->collective("all-reduce of " + std::to_string(tensor.numel()) + " values", context, [&] {
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp::SUM;
    o.timeout = impl_->timeout;
    return impl_->pg->allreduce(v, o);
  });
}

void Transport::open_group(const std::vector<int>& group, const std::string& context) {
  impl_->check_ok(context);
  const auto me = std::find(group.begin(), group.end(), rank());
  TORCH_CHECK(!impl_->cuda, "rank ", rank(), ": group sums (", context, ") need the gloo backend");
  TORCH_CHECK(me != group.end(), "rank ", rank(), ": open_group (", context, ") of a group without this rank");
  if (impl_->groups.count(group)) return;
  std::string name, ranks;  // its store prefix: group/2/3 (gather/2/3/4 for the all-gathers)
  for (int r : group) {
    TORCH_CHECK(r >= 0 && r < world_size(), "rank ", rank(), ": open_group (", context, "): rank ", r, " of ",
                world_size());
    name += "/" + std::to_string(r);
    ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  }
  const int member = static_cast<int>(me - group.begin()), size = static_cast<int>(group.size());
  try {
    Impl::Group g;
    g.sums = compat::make_gloo(compat::make_prefix_store("group" + name, impl_->store), member, size, impl_->timeout,
                               impl_->env.master_addr);
    if (size > 2)
      g.gathers = compat::make_gloo(compat::make_prefix_store("gather" + name, impl_->store), member, size,
                                    impl_->timeout, impl_->env.master_addr);
    impl_->groups[group] = std::move(g);
  } catch (const std::exception& e) {
    const int peer = group.size() == 2 ? group[group[0] == rank() ? 1 : 0] : -1;
    throw impl_->failure("connecting the process group of ranks " + ranks, peer, context, cause_of(e));
  }
}

void Transport::start_group_sum(const std::vector<int>& group, const at::Tensor& tensor, const std::string& context) {
  impl_->check_ok(context);
  auto it = impl_->groups.find(group);
  TORCH_CHECK(it != impl_->groups.end(), "rank ", rank(), ": start_group_sum (", context, ") before open_group");
  TORCH_CHECK(
      tensor.dim() == 1 && tensor.is_contiguous() && tensor.is_cpu() && at::isFloatingType(tensor.scalar_type()),
      "rank ", rank(), ": start_group_sum (", context, ") takes a 1-D contiguous floating-point CPU tensor, got ",
      tensor.toString(), " ", tensor.sizes());
  // Note [group sums of more than two in rank order]: the sums started before whose parts have
  // all arrived go on to their second phase, oldest first (so every member posts the all-gathers
  // in the same order, whatever the timing).
  for (Impl::GroupSum& s : impl_->group_sums) {
    if (s.summed || s.group.size() <= 2) continue;
    if (!s.work->isCompleted()) break;
    impl_->sum_parts_and_gather(s);
  }
  Impl::GroupSum sum{group, {tensor}, compat::WorkPtr(), {}, false, context};
  const int M = static_cast<int>(group.size());
  if (M <= 2) {
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp::SUM;
    o.timeout = impl_->timeout;
    sum.work = it->second.sums->allreduce(sum.tensors, o);
  } else {
    const int me = static_cast<int>(std::find(group.begin(), group.end(), rank()) - group.begin());
    const int64_t n = tensor.numel();
    std::vector<int64_t> in(M), out(M, n * (me + 1) / M - n * me / M);
    for (int j = 0; j < M; ++j) in[j] = n * (j + 1) / M - n * j / M;
    sum.tensors.push_back(at::empty({M * out[0]}, tensor.options()));
    c10d::AllToAllOptions o;
    o.timeout = impl_->timeout;
    sum.work = it->second.sums->alltoall_base(sum.tensors[1], sum.tensors[0], out, in, o);
  }
  impl_->group_sums.push_back(std::move(sum));
}

void Transport::wait_group_sums() {
  while (!impl_->group_sums.empty()) {
    Impl::GroupSum sum = std::move(impl_->group_sums.front());
    impl_->group_sums.pop_front();
    const std::string what = "sum of " + std::to_string(sum.tensors[0].numel()) + " values over the group";
    if (sum.group.size() <= 2) {
      impl_->collective(what, sum.context, [&] { return sum.work; }, sum.group);
      continue;
    }
    if (!sum.summed) impl_->sum_parts_and_gather(sum);
    for (const compat::WorkPtr& w : sum.gathers)
      impl_->collective(what + " (all-gather)", sum.context, [&] { return w; }, sum.group);
  }
}

void Transport::barrier(const std::string& context) {
  flush(context);
  impl_->collective("barrier", context, [&] {
    c10d::BarrierOptions o;
    o.timeout = impl_->timeout;
    return impl_->pg->barrier(o);
  });
}

std::string Transport::broadcast_bytes(const std::string& bytes, int root, const std::string& context) {
  impl_->check_ok(context);
  TORCH_CHECK(root >= 0 && root < world_size(), "broadcast_bytes (", context, "): root ", root, " is not a rank (0..",
              world_size() - 1, ")");
  const bool me = rank() == root;
  auto bcast = [&](at::Tensor& t, const std::string& what) {
    std::vector<at::Tensor> v{impl_->on_device(t)};
    impl_->collective(what, context, [&] {
      c10d::BroadcastOptions o;
      o.rootRank = root;
      o.rootTensor = 0;
      o.timeout = impl_->timeout;
      return impl_->pg->broadcast(v, o);
    });
    if (impl_->cuda) t.copy_(v[0].cpu());
  };
  at::Tensor size = at::full({1}, me ? static_cast<int64_t>(bytes.size()) : int64_t(0), at::kLong);
  bcast(size, "broadcast of a byte count from rank " + std::to_string(root));
  const int64_t n = size.item<int64_t>();
  TORCH_CHECK(n >= 0 && n <= impl_->opts.max_message_bytes, "rank ", rank(), ": broadcast_bytes (", context, "): rank ",
              root, " announced ", n, " bytes");
  if (n == 0) return std::string();
  at::Tensor data = at::empty({n}, at::kByte);
  if (me) std::memcpy(data.data_ptr<uint8_t>(), bytes.data(), n);
  bcast(data, "broadcast of " + std::to_string(n) + " bytes from rank " + std::to_string(root));
  return std::string(reinterpret_cast<const char*>(data.data_ptr<uint8_t>()), n);
}

std::vector<std::string> Transport::gather_bytes(const std::string& bytes, int root, const std::string& context) {
  TORCH_CHECK(root >= 0 && root < world_size(), "gather_bytes (", context, "): root ", root, " is not a rank (0..",
              world_size() - 1, ")");
  flush(context);
  if (rank() != root) {
    at::Tensor t = at::empty({static_cast<int64_t>(bytes.size())}, at::kByte);
    if (!bytes.empty()) std::memcpy(t.data_ptr<uint8_t>(), bytes.data(), bytes.size());
    // Directly, not through the comm thread: it is idle after flush().
    Pending p{root, t, kGatherTag, impl_->send_seq[root]++, steady_now_ns(), context, impl_->take_corruption()};
    try {
      impl_->do_send(std::move(p));
    } catch (...) {
      impl_->record(std::current_exception());
      throw;
    }
    return {};
  }
  std::vector<std::string> out(world_size());
  out[root] = bytes;
  for (int r = 0; r < world_size(); ++r) {
    if (r == root) continue;
    Message m = impl_->recv(r, kGatherTag, context);
    out[r].assign(reinterpret_cast<const char*>(m.data()), m.size());
  }
  return out;
}

void Transport::inject_raw_header_for_testing(int dst, const std::vector<int64_t>& words, const std::string& context,
                                              const std::vector<uint8_t>& inline_body) {
  impl_->check_peer(dst, "send to");
  at::Tensor h = at::zeros({kHeaderBytes + static_cast<int64_t>(inline_body.size())}, at::kByte);
  for (int64_t i = 0; i < kHeaderWords && i < static_cast<int64_t>(words.size()); ++i)
    std::memcpy(h.data_ptr<uint8_t>() + 8 * i, &words[static_cast<size_t>(i)], 8);
  if (!inline_body.empty()) std::memcpy(h.data_ptr<uint8_t>() + kHeaderBytes, inline_body.data(), inline_body.size());
  std::vector<at::Tensor> hv{impl_->on_device(h)};
  compat::wait(impl_->pg->send(hv, dst, kFrameTag), impl_->timeout);
}

void Transport::corrupt_next_send(Corruption kind) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->corrupt_next = kind;
}

TransportStats Transport::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->stats;
}

void Transport::reset_stats() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->stats = TransportStats();
}

}  // namespace tl::ranks
