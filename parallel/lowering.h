#pragma once
// Lowering: a compute schedule (per rank, its forwards and backwards; parallel/schedule.h) becomes
// the list a rank executes, with the messages between ranks and the flags of each gradient send.
// lower() runs four passes, each usable alone on lists the previous ones produced:
//   1. add_sends_and_receives: a receive before each compute action that needs another rank's
//      output, a send after each one whose output another rank needs (Note [lowering]);
//   2. order_receives_as_sent: on each link, receives in the order the peer sends
//      (Note [receive in the order sent] in lowering.cpp);
//   3. mark_epilogue_only: Optimus-CC's compress_backward flag (Note [epilogue-only backward
//      compression (Optimus-CC)]);
//   4. mark_critical: the dependency graph's critical flag (Note [slack of a gradient send] in
//      parallel/slack.h).
//
// Note [blocking send/recv and the order of messages on a link]. The multi-process runtime uses
// plain blocking send/recv (Gloo's batched isend/irecv hangs). On Gloo a send is a rendezvous:
// the bytes move only once the peer has posted the matching recv, so `send` blocks until the peer
// reaches it. Two rules make such a program deadlock-free:
//   1. On every link (s, s+1) both ends perform their halves of the link's messages in the same
//      order: if stage s's list sends activation 3 and then receives gradient 0, stage s+1's list
//      receives activation 3 before it sends gradient 0. (If not, both can sit in a send, each
//      waiting for the other's recv.)
//   2. No cycle of waits across links. Every list here has the shape "warm-up forwards, then
//      pairs, then cool-down backwards", and the simulator in tests/parallel/schedule_test.cpp runs
//      every list of 1..8 stages x 1..16 micro-batches with rendezvous semantics (and with a
//      per-rank FIFO send thread) and finds no deadlock and no mismatched message.
// 1F1B's textbook steady state on stage s, "RecvAct(f) F(f) SendAct(f) RecvGrad(b) B(b) SendGrad(b)",
// breaks rule 1: on link (s-1, s) stage s sends gradient b (end of its step) before it receives
// activation f+1 (start of its next step), while stage s-1 sends activation f+1 (right after its
// forward) before it receives gradient b. Both sit in a send. Here the receive of the next
// activation moves before the gradient send, so that on every link the activation of the steady
// step goes first, then the gradient:
//     warm-up:   RecvAct(f) F(f) SendAct(f)            (f < w = min(S - s - 1, M)), then RecvAct(w)
//     steady:    F(f) SendAct(f) RecvGrad(b) B(b) RecvAct(f + 1) SendGrad(b)
//     cool-down: RecvGrad(b) B(b) SendGrad(b)
// (no RecvAct on the first stage, no SendAct / RecvGrad on the last). Waiting for activation f+1
// before sending gradient b costs nothing: stage s-1 sent it right after its forward, before it
// started waiting for gradient b. With a communication thread (sends queued and executed in list
// order) the same lists are safe too, and compute never blocks on a send. (Receiving gradient b
// *before* sending activation f would also satisfy rule 1 but delays every activation by a round
// trip on the link: on a 100 ms link that is 200 ms per micro-batch.)
//
// Note [interleaving needs the send thread]. With several stages per rank (interleaved 1F1B) the
// messages go round the ring (the last rank's stage sends to rank 0's next stage), and rule 1
// cannot hold with purely blocking sends: with P = 2 ranks, rank 1 sends stage 1's activation to
// rank 0 (stage 2) while rank 0 sends the next micro-batch to rank 1 (stage 1), each waiting for
// the other's receive. With sends queued on a communication thread (SendMode::SendQueue), which
// is how the multi-process runtime sends, every interleaved list runs; tests/parallel/
// schedule_test.cpp checks up to 4 ranks x 3 virtual stages x 16 micro-batches. (Megatron batches
// the two transfers into one P2P call for the same reason.)
//
// Note [ZB-H1 needs the send thread]. Lowering moves the next forward's activation receive before
// a gradient send only when that forward comes right after the backward. In ZB-H1 a W often sits
// between them (rank r: I_k, W_{k-r}, F_{k+...}); moving the receive there would make the rank wait
// for the activation before its W, and the W would then delay the gradient its neighbour waits
// for (a slot per rank per step on uniform stages, the bubble ZB-H1 exists to remove). So the
// receive stays after the W, the gradient goes first on that link while the neighbour sends the
// activation first, and with purely blocking sends both sit in a send. With the runtime's send
// thread (SendMode::SendQueue) every ZB-H1 list of 1..8 ranks x 1..16 micro-batches runs
// (tests/parallel/schedule_test.cpp), as Note [interleaving needs the send thread] says of
// interleaved 1F1B.
//
// Note [epilogue-only backward compression (Optimus-CC)]. Optimus-CC compresses only the
// gradient sends on the critical path of 1F1B: those of the cool-down phase (the receiver is
// waiting for them, nothing overlaps them) and the last send of the steady state (it opens the
// cool-down of the stage before). Steady-state sends before that overlap the receiver's forward
// work and go uncompressed. mark_epilogue_only marks a gradient send `compress_backward = false` when its rank
// still has a forward to run after it (for 1F1B: every steady-state send but the last); every
// other SendGrad (all of GPipe's: its backward phase is one long drain) keeps `true`.
// The flag only matters when a boundary is configured epilogue-only; otherwise executors ignore it.

#include "parallel/schedule.h"

namespace tl {

// Note [lowering]. A message crosses between ranks wherever a stage's neighbour lives on another
// rank (on the same rank the payload is handed over in memory: no action). add_sends_and_receives
// places, for each compute action in a rank's list, the receives of its inputs right before it
// and the sends of its outputs right after it, with one exception that keeps the blocking-send
// rule 1 above: when a compute action sends a gradient to rank p and the rank's next compute action
// needs an activation from p, that receive moves before the gradient send (on every link the
// activation of a steady step goes first, then the gradient). The flags of Note [epilogue-only]
// are decided from the list: a gradient send is off the critical path when its rank still has a
// forward to run after it (the receiver then has forward work to overlap it with).

/// Runs the four passes on compute-only lists (one per rank of `layout`); errors name a rank and
/// action that is a message.
std::vector<RankSchedule> lower(const std::vector<RankSchedule>& compute, const StageLayout& layout);

/// Pass 1: the sends and receives of compute-only lists, every flag at its default (Note [lowering]).
std::vector<RankSchedule> add_sends_and_receives(const std::vector<RankSchedule>& compute, const StageLayout& layout);
/// Pass 2: each receive preceded by the receives of whatever its sender sent before it on that link
/// and the list had not yet received (Note [receive in the order sent]). A no-op on round-robin
/// placements.
void order_receives_as_sent(std::vector<RankSchedule>& lists);
/// Pass 3: compress_backward = false on a gradient send followed by a forward in its rank's list.
void mark_epilogue_only(std::vector<RankSchedule>& lists);
/// Pass 4: critical = false on a gradient send with slack on the step's dependency graph with
/// uniform stages (forward 1, backward 2, I and W 1 each). Lists without a backward a message needs,
/// or with a cycle, keep every send critical: validate_schedule says what is wrong with them.
void mark_critical(std::vector<RankSchedule>& lists, const StageLayout& layout);

}  // namespace tl
