#pragma once
// Transport: variable-size messages between the ranks of a multi-process pipeline over c10d
// (ProcessGroupGloo on CPU; ProcessGroupNCCL where the libtorch has it), plus the few collectives
// the runtime needs (tied-embedding all-reduce, barrier, broadcast and gather of byte strings).
//
// Note [wire protocol]. A message is one plain blocking c10d send/recv pair: a frame, the header,
// 8 int64 (64 bytes): magic|version, sequence number on this (src, dst) pair, the caller's tag,
// body bytes n, the sender's steady-clock stamp in ns (for link emulation, see parallel/link.h),
// the body's checksum (Note [body checksum]), the layout (0: the body follows in this frame, 1:
// the body follows as its own operation, 2: in pieces, Note [bodies in pieces]) and a check word
// (xor of the others with a constant); then the body, 64-byte aligned in the frame. A body larger
// than the receiver's posted capacity (Note [posted capacity]) travels as a second operation,
// once: the capacity grows to it.
// The receiver posts each frame recv at its capacity (Gloo accepts a shorter message into a
// larger recv), so a message costs one rendezvous, not two; on NCCL, which needs exact sizes, the
// capacity is 0: the frame is the bare header and the body always its own operation. No batched
// isend/irecv (it hangs on Gloo). The receiver validates the header before it reads the body:
// bad magic or check word (garbage, or another program on the port), an absurd size
// (> TransportOptions::max_message_bytes), a sequence gap, a layout other than its capacity says,
// or a tag other than the one expected (the two schedules disagree) are errors naming the peer
// and the caller's context. (A frame longer than the posted capacity cannot be caught: Gloo
// aborts the process. Only another program would send one.)
//
// Note [posted capacity]. Both ends of a (src, dst) pair keep the same capacity, the body bytes
// the receiver's next frame recv holds: 128 KiB to start (wire::kInlineMax), raised after a
// larger message to its size (rounded up to 1/8 of a power of two, at most wire::kPostedMax), and
// lowered when 16 messages in a row were all at most a quarter of it. Each end updates it from
// the sizes of the messages of the pair, in order, so the sender knows what the receiver posted
// without asking: a stream of messages of one size is one operation each, after the first of a
// larger size. The frame of a body the sender wrote into a Transport::message_buffer() is that
// buffer itself (the header goes in the 64 bytes before the body: no copy); another body is
// copied into a pooled frame, summed in the same pass (checksum.h's crc32c_copy).
//
// On Gloo a send completes only once the peer posts the matching recv, so callers must order
// sends and recvs as parallel/lowering.h's Note [blocking send/recv] explains.
//
// Note [body checksum]. The header carries the CRC-32C of the body (bit 32 set: present), computed
// by the sender from the bytes it sends and checked by the receiver before anything reads them: a
// bit flipped anywhere between the two (a faulty NIC, memory or switch that the 16-bit TCP
// checksum misses, or a frame shorter than its header says) is an error naming the peer and the
// message, never a wrong tensor. Bodies on a CUDA device (NCCL) carry no checksum (word 0) and are
// not checked. Cost: one pass over the body at each end (AVX-512 carry-less folding where the CPU
// has it, else SSE4.2: parallel/ranks/checksum.h); a body copied into its frame is summed in the
// same pass, and a large body is summed in pieces while it travels (Note [bodies in pieces]).
//
// Note [bodies in pieces]. A checksummed body of TransportOptions::pieces_min_bytes or more
// (dist.pieces_min_bytes, 8 MiB; Gloo only) travels as a bare frame (layout word kLayoutPieces with
// the piece count in its high bits, body word kBodyCrcPresent alone), then the body in `count`
// pieces of piece_span() bytes, each its own c10d operation, then a trailer: kTrailerMagic, the
// sequence number, the count, each piece's CRC-32C and a check word. The sender posts every piece's
// send, then sums the pieces while Gloo's thread moves them, then posts the trailer; the receiver,
// on reading the frame, posts every piece's recv and the trailer's, sums piece k as soon as it has
// arrived (while k + 1 is still on the wire) and checks the sums when the trailer comes. So the two
// passes over the body run during the transfer instead of one before it and one after
// (docs/PIPELINE.md, "Bodies in pieces"), and the body is sent from the caller's tensor, never
// copied into a frame. Smaller messages are unchanged (one c10d operation each). A piece count out
// of range, a garbled trailer or a piece whose sum differs is an error naming the peer, the message
// and the piece; a message in pieces leaves the posted capacity as it was (both ends know its
// layout).
//
// Note [failures are errors, never hangs]. Every operation waits at most timeout_s
// (config dist.timeout_s). A dead peer (its socket closes) fails the pending operation at once; a
// silent one fails it at the timeout. Either way the TransportError names the peer rank, what
// was being done and the caller's context ("step 12, boundary 2 forward"), and says whether the
// peer process still exists (checked through /proc for ranks on this machine). After an error the
// transport is broken: every later call rethrows the first error.
//
// Note [communication thread]. With TransportOptions::comm_thread, send() only queues the message
// (stamped when queued) and returns; one thread sends the queue in order, so sends overlap the
// caller's compute and keep the list order that makes blocking sends safe. An error on that
// thread is thrown by the next call (send, recv, flush, a collective). flush() waits for the
// queue to drain. The thread keeps up to 4 messages posted at once (it posts the next queued
// message before waiting for the ones before it), so that the peer's recv-ready notice finds the
// send already posted instead of waking the thread: the messages of a burst flow as raw c10d
// sends do. Posting a send earlier never makes a rank wait longer, and Gloo keeps the order of
// the sends to one rank.
//
// Note [link emulation at the receiver]. With a LinkSpec for (src -> this rank), recv() hands each
// message to a Link (parallel/link.h) as sent at the sender's stamp, with the body's byte count,
// and sleeps until the emulated delivery. Stamps are steady_clock (CLOCK_MONOTONIC), comparable
// between processes of one machine; for a peer on another machine (its boot id differs) the
// receiver uses its own header arrival time instead. Messages of gather_bytes (checkpoints) and
// the collectives are not emulated.
//
// Note [pre-posted frames and reused buffers]. On Gloo a send moves its bytes only once the
// receiver's recv is posted and the receiver has told the sender so (a "recv ready" notice, half a
// round trip before any byte flows). As soon as it has read a frame from rank s, the receiver
// posts the recv of that frame's body, if one follows (that notice first: the sender waits for
// it), then the recv of s's next frame at the capacity (Gloo only): s's next message then flows
// as soon as s sends it, without waiting for the receiver to call recv() or to check this body,
// so a stream of messages flows like raw c10d sends.
// Buffers are reused once nothing else refers to them: neither another handle to the tensor (a
// Message's body, a queued send) nor a view of its storage (a body narrowed from its frame): the
// receiver's frame buffers per source (3), its last separate body buffer (>= 256 KiB) per source,
// and the sender's frame buffers per destination (one per message in flight). That saves an
// allocation and the page faults of fresh memory per message. None of this changes what is
// received or in which order. A received body is a view of its frame. recv_payload's payload body
// is a view of that, not a copy, for 256 KiB or more in a frame at most twice its size; other
// payloads are copied out, so that a held payload does not keep a frame much larger than itself.
//
// Threads: one caller thread per Transport (the stage's thread); not for concurrent callers.

#include <ATen/ATen.h>

#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "compression/payload.h"
#include "parallel/ranks/rendezvous.h"
#include "parallel/link.h"

namespace tl::ranks {

/// Note [wire protocol]'s header, for tools and tests that speak it.
namespace wire {
constexpr int64_t kMagic = (int64_t(0x544C4D53) << 16) | 5;  // "TLMS", version 5 (5: bodies in pieces)
constexpr int64_t kCheckSalt = 0x5A5A5A5A5A5A5A5ALL;
constexpr int64_t kHeaderWords = 8;
constexpr int64_t kHeaderBytes = kHeaderWords * 8;
constexpr int64_t kInlineMax = 128 << 10;           // the posted capacity to start with (Gloo)
constexpr int64_t kPostedMax = int64_t(256) << 20;  // larger bodies always travel as their own operation
/// A tag with this bit set is not delayed by the emulated link (side messages that exist only
/// for statistics: Note [reference tensors] in parallel/channel.h).
constexpr int64_t kTagNoLink = int64_t(1) << 61;
enum Word { kWordMagic = 0, kWordSeq, kWordTag, kWordBytes, kWordStamp, kWordBodyCrc, kWordLayout, kWordCheck };
/// The layout word: the body follows in the frame, or as its own operation, or in pieces (Note
/// [bodies in pieces]: kLayoutPieces | count << kPieceCountShift).
constexpr int64_t kLayoutInFrame = 0, kLayoutSeparate = 1, kLayoutPieces = 2;
constexpr int kPieceCountShift = 8;
/// A body in pieces has 2..kMaxPieces of them, each non-empty.
constexpr int64_t kMaxPieces = 256;
/// The first word of a trailer (Note [bodies in pieces]) and its size in words for `count` pieces.
constexpr int64_t kTrailerMagic = (int64_t(0x544C5452) << 16) | 5;  // "TLTR"
inline int64_t trailer_words(int64_t count) { return 4 + count; }
/// Piece k of a body of n bytes in `count` pieces: [offset, offset + bytes). Every piece but the
/// last has the same size, a multiple of 64 bytes.
struct PieceSpan {
  int64_t offset = 0, bytes = 0;
};
PieceSpan piece_span(int64_t n, int64_t count, int64_t k);
/// The piece count the sender uses for n bytes: about n / piece_bytes, in [2, kMaxPieces].
int64_t piece_count(int64_t n, int64_t piece_bytes);
/// The pieces' sums in a trailer of `size` bytes, checked: throws std::runtime_error saying what is
/// wrong (its size for `expected_count` pieces, magic, check word, sequence number, count).
std::vector<uint32_t> parse_trailer(const uint8_t* data, size_t size, int64_t expected_seq, int64_t expected_count);
/// A trailer's words for `sums`.
std::vector<int64_t> make_trailer(int64_t seq, const std::vector<uint32_t>& sums);
/// The body word: bit 32 says a checksum is present, the low 32 bits are the body's CRC-32C.
constexpr int64_t kBodyCrcPresent = int64_t(1) << 32;
/// The check word of a header whose other words are set.
inline int64_t check_word(const int64_t* h) {
  return h[kWordMagic] ^ h[kWordSeq] ^ h[kWordTag] ^ h[kWordBytes] ^ h[kWordStamp] ^ h[kWordBodyCrc] ^ h[kWordLayout] ^
         kCheckSalt;
}
/// The body word for `n` host bytes (Note [body checksum]).
int64_t body_crc_word(const uint8_t* body, size_t n);
/// Note [posted capacity]: the body bytes the receiver's next frame recv from a peer holds, kept
/// alike at both ends of the pair from the sizes of its messages, in order.
struct PostedCapacity {
  static constexpr int kWindow = 16;
  int64_t floor = kInlineMax;  // 0: every body is its own operation (NCCL: exact sizes only)
  int64_t bytes = kInlineMax;
  int64_t window_max = 0;  // the largest body of the current window of kWindow messages
  int window = 0;

  explicit PostedCapacity(int64_t start = kInlineMax) : floor(start), bytes(start) {}
  /// Whether a body of n bytes travels as its own operation.
  bool separate(int64_t n) const { return n > bytes; }
  /// Updates the capacity after a message of n body bytes.
  void after(int64_t n);
  /// n rounded up to a multiple of 1/8 of the largest power of two <= n (at most 12.5% more).
  static int64_t round_up(int64_t n);
};
/// A received frame's header, validated.
struct FrameHeader {
  int64_t seq = 0, tag = 0, body_bytes = 0, stamp_ns = 0, body_crc = 0, layout = kLayoutInFrame;
  int64_t pieces = 0;  // kLayoutPieces: how many (Note [bodies in pieces]); else 0
};
/// Reads and checks the header at the start of a received frame of `size` bytes: the magic, the
/// check word, a body size in [0, max_body_bytes], a known layout, the expected sequence number
/// and (when `expected_tag` is given) the tag. Throws std::runtime_error saying what was wrong; the
/// transport adds the peer, the message and the context.
FrameHeader parse_frame_header(const uint8_t* data, size_t size, int64_t expected_seq, const int64_t* expected_tag,
                               int64_t max_body_bytes);
}  // namespace wire

/// A failed communication. peer() is the rank at fault (-1 when unknown, e.g. a collective), and
/// what() says what happened, where and with whom.
class TransportError : public std::runtime_error {
 public:
  TransportError(const std::string& what, int peer, std::string context, std::vector<int> suspects = {})
      : std::runtime_error(what), peer_(peer), context_(std::move(context)), suspects_(std::move(suspects)) {}
  int peer() const { return peer_; }
  const std::string& context() const { return context_; }
  /// Other ranks the message names as stopped or exited: where a chain of waits may end when
  /// `peer` itself still runs (Note [who stalled the run]).
  const std::vector<int>& suspects() const { return suspects_; }

 private:
  int peer_;
  std::string context_;
  std::vector<int> suspects_;
};

/// What Transport::corrupt_next_send does to a message, after its checksum was taken (fault
/// injection, parallel/ranks/fault.h): half of the body is sent (of a body in pieces: half of its
/// last piece), one bit of it is flipped, or the header announces more bytes than a receiver
/// accepts.
/// Trailer (tests): a bit of a body-in-pieces' trailer is flipped after its check word (other
/// messages: as BitFlip).
enum class Corruption { None, Truncate, BitFlip, Oversize, Trailer };

struct TransportOptions {
  std::string backend = "gloo";                  // "gloo" (CPU) or "nccl" (CUDA, where built)
  double timeout_s = 60.0;                       // dist.timeout_s: every wait, rendezvous included
  bool comm_thread = false;                      // Note [communication thread]
  bool checksum = true;                          // send bodies' CRC-32C (Note [body checksum]); false: benchmarks
  // Note [bodies in pieces]: checksummed bodies of pieces_min_bytes or more (0: never) travel in
  // pieces of about piece_bytes.
  int64_t pieces_min_bytes = int64_t(8) << 20;
  int64_t piece_bytes = int64_t(1) << 20;
  int64_t max_message_bytes = int64_t(1) << 34;  // larger announced bodies are rejected (16 GiB)
  double corrupt_rate = 0.0;                     // dist.corrupt_rate: flip a bit of a sent body with this probability
  uint64_t corrupt_seed = 0;                     // ... drawn from this seed and the rank
  LinkSpec link;                                 // emulated link into this rank from every peer
  std::map<int, LinkSpec> link_from;             // per source rank, overriding `link`
};

/// A received message.
struct Message {
  int src = -1;
  int64_t tag = 0;
  int64_t seq = 0;
  at::Tensor body;          // (n) uint8 on CPU, n may be 0
  double sent_s = 0.0;      // sender's stamp, steady clock seconds
  double wait_s = 0.0;      // how long recv() blocked, link emulation included
  double transfer_s = 0.0;  // header arrived -> separate body arrived (0 for a body in the frame)
  double link_s = 0.0;      // time slept for the emulated link
  const uint8_t* data() const { return body.numel() ? body.data_ptr<uint8_t>() : nullptr; }
  size_t size() const { return static_cast<size_t>(body.numel()); }
};

/// Counters since connect (or reset_stats).
struct TransportStats {
  int64_t messages_sent = 0, messages_received = 0;
  int64_t bytes_sent = 0, bytes_received = 0;  // bodies
  int64_t sent_in_pieces = 0;                  // messages sent as bodies in pieces (Note [bodies in pieces])
  double send_s = 0.0;                         // time in blocking sends (the caller's, or the comm thread's)
  double recv_wait_s = 0.0;                    // time the caller blocked in recv, link emulation included
  double link_s = 0.0;                         // of which emulated link delay
};

class Transport {
 public:
  /// Rendezvous from `env` (TCPStore hosted by rank 0, or the agent's with agent_store; keys under
  /// env.store_prefix()) and a process group of env.world_size ranks. Errors (a rank that never
  /// arrives within timeout_s, an unknown backend, a build without it) name what and where.
  static std::unique_ptr<Transport> connect(const DistEnv& env, const TransportOptions& options = {});
  /// Whether this build can connect with `backend` ("gloo", "nccl").
  static bool available(const std::string& backend = "gloo");

  ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  int rank() const;
  int world_size() const;
  const DistEnv& env() const;

  /// `n` bytes for the caller to fill and send(), or a prefix of them (narrow(0, 0, m)): the frame
  /// is the buffer itself, its header written in the 64 bytes before them (Note [posted
  /// capacity]). While one send of it is in flight, another is copied. Any other tensor works too.
  static at::Tensor message_buffer(int64_t n);

  /// Sends `body` (uint8; 1-D, contiguous, CPU) to `dst` with the caller's `tag` (>= 0; the
  /// receiver may check it). `context` says where in the run this is, for error messages.
  void send(int dst, const at::Tensor& body, int64_t tag, const std::string& context);
  /// As above for bytes the caller gives up (kept alive until sent, no copy).
  void send(int dst, std::vector<uint8_t>&& bytes, int64_t tag, const std::string& context);
  /// Sends payload.serialize().
  void send_payload(int dst, const Payload& payload, int64_t tag, const std::string& context);

  /// Receives the next message from `src`. With expected_tag >= 0, a different tag is an error.
  Message recv(int src, int64_t expected_tag, const std::string& context);
  /// Receives and deserializes a Payload (body on `device`); a corrupt payload is a TransportError
  /// naming the peer. `info`, if given, receives the message's timings (body moved out).
  Payload recv_payload(int src, int64_t expected_tag, const std::string& context, at::Device device = at::kCPU,
                       Message* info = nullptr);

  /// Waits until every queued send has gone (no-op without comm thread); rethrows its error.
  void flush(const std::string& context);

  /// In-place sum over all ranks (tied embeddings). CPU contiguous for gloo.
  void all_reduce_sum(at::Tensor& tensor, const std::string& context);

  /// Note [group sums in flight]. A c10d process group of the ranks `group` (this rank among
  /// them; every member passes the same list, in the same order), for sums the caller starts and
  /// waits for later: open_group() makes it (collective over the group; once per group), then
  /// start_group_sum() starts an in-place sum of `tensor` (1-D, contiguous, floating, CPU) and
  /// returns at once, while the process group's own threads move and add the bytes, and
  /// wait_group_sums() waits for every sum started, in order. Gloo only. Every member gets the
  /// bits of Note [sums in rank order] (group_sum.h): two members' Gloo all-reduce is a + b ==
  /// b + a; more members' is Note [group sums of more than two in rank order] below. The bytes
  /// carry no body checksum (they are not tapeline frames). A failure is a TransportError naming
  /// the peer (of two members, the other; else one that exited), the sum and the caller's context.
  ///
  /// Note [group sums of more than two in rank order]. Gloo's ring all-reduce starts each chunk's
  /// sum at another member, so for M > 2 the sum is all_reduce_in_rank_order's two phases on the
  /// group's process groups instead, with all_reduce_in_rank_order's chunks: (1) one all-to-all
  /// sends chunk j of every member to member j (Gloo's threads move it while the caller goes on);
  /// (2) once those parts have arrived, member j adds them in member order into its chunk and
  /// broadcasts it from there to the others, on a second process group of the same ranks. Phase 2
  /// starts for the oldest sums whose parts have arrived when a later sum starts, and for the rest
  /// in wait_group_sums(). Two process groups keep each one's sequence of collectives the same on
  /// every member whatever the timing (phase 2 starts in the order the sums started). Each member
  /// sends and receives 2 (M - 1) / M of the tensor's bytes, as a ring.
  void open_group(const std::vector<int>& group, const std::string& context);
  void start_group_sum(const std::vector<int>& group, const at::Tensor& tensor, const std::string& context);
  void wait_group_sums();
  /// Returns when every rank has called it (after flush()).
  void barrier(const std::string& context);
  /// Root's `bytes` on every rank.
  std::string broadcast_bytes(const std::string& bytes, int root, const std::string& context);
  /// On `root`: every rank's bytes, by rank. On others: empty. Uses messages (after flush()).
  std::vector<std::string> gather_bytes(const std::string& bytes, int root, const std::string& context);

  /// Names each rank's place in the run ("stage 1 of replica 0"). Every error from then on ends
  /// with the places of the ranks it names and of this rank: "[rank 2 = stage 1 of replica 0;
  /// this is rank 3 = stage 1 of replica 1]". Without it, errors name ranks by number only.
  void set_rank_names(std::function<std::string(int)> name);

  TransportStats stats() const;
  void reset_stats();

  /// Fault injection for tests and tools: sends `words` as a bare frame (a header without body),
  /// unchecked (garbage, forged sizes), to `dst`. The transport is unusable for `dst` after it.
  void inject_raw_header_for_testing(int dst, const std::vector<int64_t>& words, const std::string& context,
                                     const std::vector<uint8_t>& inline_body = {});

  /// Fault injection (Note [fault injection] in parallel/ranks/fault.h): the next message this
  /// rank sends, from any thread, is corrupted as `kind` says after its checksum was taken.
  void corrupt_next_send(Corruption kind);

  struct Impl;

 private:
  explicit Transport(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tl::ranks
