// Link emulation: the queue of Note [the link model] on a fake clock -- transmission time from
// bytes and bandwidth, latency, queueing behind earlier messages, pipelined latency, unlimited
// links, and the receiver-side wait.
#include "parallel/link.h"

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <vector>

namespace tl {
namespace {

TEST(Link, SingleMessageTakesLatencyPlusBitsOverBandwidth) {
  Link link({/*bandwidth_mbps=*/80, /*latency_ms=*/100});
  // 1 MB at 80 Mbit/s: 8e6 bits / 80e6 bit/s = 0.1 s, plus 0.1 s latency.
  EXPECT_DOUBLE_EQ(link.transmission_s(1000000), 0.1);
  EXPECT_DOUBLE_EQ(link.transmit(5.0, 1000000), 5.2);
  EXPECT_DOUBLE_EQ(link.free_at_s(), 5.1);
  EXPECT_EQ(link.bytes(), 1000000);
  EXPECT_EQ(link.messages(), 1);
}

TEST(Link, MessagesQueueBehindEachOtherAndLatencyIsPipelined) {
  Link link({80, 100});
  // Three 1 MB messages handed over at once: transmissions back to back (0.1 s each), each
  // delivered 0.1 s after its transmission ends -- latency overlaps the next transmission.
  EXPECT_DOUBLE_EQ(link.transmit(0.0, 1000000), 0.2);
  EXPECT_DOUBLE_EQ(link.transmit(0.0, 1000000), 0.3);
  EXPECT_DOUBLE_EQ(link.transmit(0.0, 1000000), 0.4);
  // A message sent after the link went idle does not queue.
  EXPECT_DOUBLE_EQ(link.transmit(1.0, 500000), 1.0 + 0.05 + 0.1);
  // One sent while the link is still busy waits for it.
  EXPECT_DOUBLE_EQ(link.transmit(1.01, 1000000), 1.05 + 0.1 + 0.1);
}

TEST(Link, UnlimitedBandwidthOnlyAddsLatency) {
  Link link({0, 50});
  EXPECT_DOUBLE_EQ(link.transmission_s(1 << 30), 0.0);
  EXPECT_DOUBLE_EQ(link.transmit(1.0, 1 << 30), 1.05);
  EXPECT_DOUBLE_EQ(link.transmit(1.0, 1 << 30), 1.05);  // no queueing without transmission time
  Link ideal;
  EXPECT_TRUE(ideal.spec().is_ideal());
  EXPECT_DOUBLE_EQ(ideal.transmit(3.0, 123), 3.0);
}

TEST(Link, ResetEmptiesTheQueue) {
  Link link({8, 0});  // 1 byte per microsecond
  link.transmit(0.0, 1000000);
  EXPECT_DOUBLE_EQ(link.free_at_s(), 1.0);
  link.reset();
  EXPECT_DOUBLE_EQ(link.transmit(0.0, 1000), 0.001);
  EXPECT_EQ(link.messages(), 1);
}

TEST(Link, ReceiverWaitsOnAFakeClock) {
  FakeClock clock(10.0);
  Link link({80, 100});
  // Message sent at 10.0, received (for real) at 10.0: emulated delivery at 10.2.
  EXPECT_NEAR(wait_for_delivery(link, clock, 10.0, 1000000), 0.2, 1e-12);
  EXPECT_DOUBLE_EQ(clock.now_s(), 10.2);
  // The next one was sent at 10.05 (behind the first on the link, whose transmission ended at 10.1)
  // and is delivered at 10.3: 0.1 s more.
  EXPECT_NEAR(wait_for_delivery(link, clock, 10.05, 1000000), 0.1, 1e-12);
  EXPECT_DOUBLE_EQ(clock.now_s(), 10.3);
  // A message whose real arrival is already past its emulated delivery costs no wait.
  clock.advance(5.0);
  EXPECT_DOUBLE_EQ(wait_for_delivery(link, clock, 10.4, 1000), 0.0);
  EXPECT_DOUBLE_EQ(clock.now_s(), 15.3);
  EXPECT_NEAR(clock.slept_s(), 0.3, 1e-12);
  EXPECT_THROW(clock.advance(-1.0), c10::Error);
}

TEST(Link, SteadyClockIsMonotonicAndMatchesTheHeaderStamp) {
  SteadyClock clock;
  const double a = clock.now_s();
  const double stamp = steady_ns_to_s(steady_now_ns());
  const double b = clock.now_s();
  EXPECT_LE(a, stamp);
  EXPECT_LE(stamp, b);
  clock.sleep_until_s(b - 1.0);  // in the past: returns at once
  EXPECT_GE(clock.now_s(), b);
}

TEST(Link, CopiesCarryTheQueueAndLiveInContainers) {
  std::vector<Link> links;
  links.emplace_back(LinkSpec{8, 0});
  links.emplace_back(LinkSpec{80, 10});  // reallocation copies the first
  links[0].transmit(0.0, 1000000);
  Link copy = links[0];
  EXPECT_DOUBLE_EQ(copy.free_at_s(), 1.0);
  EXPECT_DOUBLE_EQ(copy.transmit(0.0, 1000), 1.001);  // queues behind the copied message
  EXPECT_DOUBLE_EQ(links[0].free_at_s(), 1.0);        // the original is independent
  links[1] = copy;
  EXPECT_EQ(links[1].spec().bandwidth_mbps, 8);
  EXPECT_EQ(links[1].messages(), 2);
}

TEST(Link, InvalidSpecsAreRejected) {
  EXPECT_THROW(Link({-1, 0}), c10::Error);
  EXPECT_THROW(Link({10, -5}), c10::Error);
  EXPECT_EQ(LinkSpec({80, 100}).describe(), "80 Mbit/s, 100 ms");
  EXPECT_EQ(LinkSpec().describe(), "unlimited, 0 ms");
}

}  // namespace
}  // namespace tl
