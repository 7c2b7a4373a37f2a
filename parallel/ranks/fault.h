#pragma once
// Fault injection into a multi-process run, for the fault matrix (tests/parallel/fault_matrix_test.cpp)
// and the corruption soak: config dist.inject_fault = RANK:PHASE:STEP:KIND and dist.corrupt_rate.
// A debugging option: it makes a healthy run fail on purpose, at a chosen place.
//
// Note [fault injection]. The named rank, and only it, does KIND at the first hook of PHASE on or
// after training step STEP (1-based, as metrics.jsonl counts):
//   rendezvous  before connecting to the others (STEP must be 0);
//   forward     its first activation send of the step (a rank holding only the last stage has none);
//   backward    its first gradient send of the step (a rank holding only the first stage has none);
//   allreduce   the step's first collective: the loss tally, or with two replicas (dp.overlap)
//               the first bucket summed during the backward; the corruptions need parallel.dp > 1
//               and hit its first data-parallel gradient message that is a tapeline frame (with
//               one replica the step's all-reduces, and with dp.overlap the buckets, are c10d
//               collectives of raw numbers: no tapeline frame to corrupt);
//   evaluate    its first evaluation send after the step (not the last stage's rank);
//   checkpoint  the first checkpoint written after the step: rank 0 (which writes the file) halfway
//               through writing its temporary file, any other rank at the send of its part.
// KIND is what happens there:
//   kill        SIGKILL to itself (a crashed rank: its sockets close);
//   stop        SIGSTOP to itself (a stalled rank: its sockets stay open, nothing moves);
//   exit        an error, as any error ends a rank (non-zero exit);
//   partition   every network interface of its network namespace but loopback goes down: run the
//               rank in a namespace of its own and it is cut off from the others (a rank in the
//               network namespace of process 1 refuses: that would cut the machine off);
//   truncate, bitflip, oversize
//               the message it sends next is corrupted after its checksum was taken: half of its
//               body is sent, one bit of it is flipped, or its header announces more bytes than
//               any receiver accepts (Transport::corrupt_next_send).
// The rank prints what it does, with the phase and the step, to stderr before doing it. A run in
// which the fault never fired (no hook of that phase at or after the step) ends with an error.
//
// dist.corrupt_rate = p flips one bit of each message a rank sends with probability p, after its
// checksum (seeded by dist.corrupt_seed and the rank): the soak's random corruption. Every
// corrupted message is logged by its sender.
#include <cstdint>
#include <optional>
#include <string>

#include "parallel/ranks/transport.h"

namespace tl::ranks {

enum class FaultPhase { Rendezvous, Forward, Backward, AllReduce, Evaluate, Checkpoint };
enum class FaultKind { Kill, Stop, Exit, Partition, Truncate, BitFlip, Oversize };

struct Fault {
  int rank = 0;
  FaultPhase phase = FaultPhase::Forward;
  int64_t step = 0;
  FaultKind kind = FaultKind::Kill;
  std::string text;  // as written
};

/// Parses RANK:PHASE:STEP:KIND (Note [fault injection]); std::invalid_argument names the part and
/// what is accepted.
Fault parse_fault(const std::string& text);
const char* phase_name(FaultPhase phase);
const char* kind_name(FaultKind kind);
/// Whether `kind` corrupts a message (truncate, bitflip, oversize) rather than the process.
bool is_corruption(FaultKind kind);

/// Arms `fault` in this process, rank `rank` of a grid with `replicas` data-parallel replicas;
/// nothing happens where fault.rank != rank. Errors: a fault that cannot fire in this run.
void arm_fault(const Fault& fault, int rank, int replicas);
/// Forgets any armed fault (tests).
void disarm_fault();
/// The training step about to run: the evaluate and checkpoint phases count from it.
void set_fault_step(int64_t step);
/// A hook of `phase` at training step `step` (-1: the step set last). `sends` says whether a
/// message follows on `transport`: a corruption is only made at such a hook (armed on the
/// transport for its next message). A process fault is carried out here. `where` says where in the
/// run this is, for the line printed.
void fault_point(FaultPhase phase, int64_t step, Transport* transport, bool sends, const std::string& where);
/// An armed fault of this rank that has not fired; the run ends with an error saying so.
std::optional<Fault> unfired_fault();

/// Takes every network interface of this process's network namespace down but loopback
/// (partition); throws, saying why, where there is none or the process may not.
void take_network_down();

}  // namespace tl::ranks
