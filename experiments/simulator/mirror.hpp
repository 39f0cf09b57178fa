/* Rank 0 alone, standing for all p ranks (replay.cpp includes it once), for a recording whose
 * every rank r does what rank 0 does with each peer r further on (rxelab.trace's
 * Trace.turns_of_rank_0), on a platform where every host and its links are like every other's
 * (a crossbar cluster, one rank per host). Turned by r, the whole replay is itself: every
 * rank is where rank 0 is at every instant, and every link carries, at every instant, the
 * same flows in the same states as rank 0's own link up (a link down to host j carries one
 * message of each of rank 0's, the ones sent to j from j - k for each k). So rank 0's
 * messages on their own routes, sharing its own link up, get the rates and times all p^2 got,
 * and the message rank s sends rank 0 arrives as rank 0's own to p - s of the same kind and
 * tag does (the n-th of the n-th). Why: the parallel all-to-all puts all p^2 of its blocks on
 * the wire at once, and SimGrid's max-min solver goes over every message on the wire at every
 * start and end (the system is one connected piece): the replay grew as p^4 (1 MiB blocks at
 * 85 MB/s: 1.3 s at p = 128, 35 s at 256, 356 s at 512), and with rank 0 alone as p^2. */
#pragma once

#include <simgrid/s4u.hpp>
#include <xbt/config.hpp>

#include "in_flight.hpp"
#include "recording.hpp"

#include <cstdio>
#include <deque>
#include <functional>
#include <iostream>
#include <string>
#include <map>
#include <set>
#include <utility>
#include <vector>

namespace sg4 = simgrid::s4u;

static const unsigned long long NAME_BITS = (1ULL << 48) - 1;  // a key's kind and tag

/* For each of rank 0's waits for a message (R), the send of its own that stands for it; -1
 * where rank 0 never makes that send, or makes it only later (then every rank waits for its
 * turned self, a deadlock: the full replay too never ends). A send nobody's wait stands on is
 * a message never waited for. Says which, or "" when they pair up. */
static std::string mirrored_waits(const std::vector<Move>& mine, int p, std::vector<int>& stands)
{
  // (peer, name): (send id, move index) of each of rank 0's sends, in its order
  std::map<std::pair<int, unsigned long long>, std::deque<std::pair<int, size_t>>> sent;
  int made = 0;
  for (size_t i = 0; i < mine.size(); i++)
    if (mine[i].kind == 'S')
      sent[{mine[i].peer, mine[i].key & NAME_BITS}].emplace_back(made++, i);
  stands.assign(mine.size(), -1);
  for (size_t i = 0; i < mine.size(); i++) {
    const Move& m = mine[i];
    if (m.kind != 'R')
      continue;
    auto it = sent.find({(p - (int)(m.key >> 48)) % p, m.key & NAME_BITS});
    if (it == sent.end() || it->second.empty())
      return "rank 0 never finished: it waits for a message nobody sends";
    if (it->second.front().second > i)
      return "rank 0 never finished: it waits for a message nobody sends before it (each "
             "rank waits for the next)";
    stands[i] = it->second.front().first;
    it->second.pop_front();
  }
  for (const auto& [name, left] : sent)
    if (!left.empty())
      return "rank 0 ended with messages it never waited for";
  return "";
}

/* The replay of rank 0 (replay.cpp's rank_main without mailboxes: its sends are host to host,
 * its waits for messages wait for their stand-ins); writes its end and peak bytes in flight.
 * A peer's messages are taken in the order it sent them, as rank_main takes them from the
 * pair's mailbox (RC's order): a wait for one also waits for every earlier one from that peer
 * not yet taken, that is for rank 0's own earlier sends to the stand-in's peer. */
static void mirror_main(const std::vector<Move>& mine, const std::vector<int>& stands,
                        const std::vector<sg4::Host*>& hosts, double flops, double* end, double* peak_out)
{
  sg4::Host* const here = hosts[0];
  std::vector<sg4::CommPtr> comms;
  std::vector<char> done;
  std::vector<int> peer_of;                  // by send id
  std::vector<std::vector<int>> to(hosts.size());  // by peer: the send ids to it, in order
  for (const Move& m : mine)
    if (m.kind == 'S') {
      to[m.peer].push_back((int)peer_of.size());
      peer_of.push_back(m.peer);
    }
  std::vector<size_t> taken(hosts.size(), 0);  // by peer: how many of `to` were taken
  std::vector<char> in_hand(peer_of.size(), 0);  // a stand-in taken, as if from its mailbox
  InFlight flight;
  double pending = 0;
  auto work = [&](double seconds) {
    if (seconds > 0)
      sg4::this_actor::execute(seconds * flops);
  };
  auto arrived = [&](int id) {  // wait_any: see rank_main's 'W'
    if (!done[id]) {
      sg4::Comm::wait_any(std::vector<sg4::CommPtr>{comms[id]});
      comms[id] = nullptr;
      done[id] = 1;
    }
  };
  for (size_t i = 0; i < mine.size(); i++) {
    const Move& m = mine[i];
    switch (m.kind) {
      case 'S': {
        work(pending + m.cpu);
        pending = 0;
        flight.sent(m);
        comms.push_back(sg4::Comm::sendto_async(here, hosts[m.peer], (uint64_t)std::max(m.bytes, 1.0)));
        done.push_back(0);
        break;
      }
      case 'R': {
        const int id = stands[i];
        if (!in_hand[id]) {  // the work before it is done before it waits (rank_main's order)
          work(pending);
          pending = 0;
        }
        for (const std::vector<int>& queue = to[peer_of[id]]; !in_hand[id];) {
          const int next = queue[taken[peer_of[id]]++];
          arrived(next);
          in_hand[next] = 1;
        }
        flight.polled();
        pending += m.cpu;
        break;
      }
      case 'W': {
        work(pending);
        pending = 0;
        for (int id : m.ids) {
          arrived(id);
          flight.waited_for(id);
        }
        flight.polled();
        break;
      }
      case 'C':
        pending += m.cpu;
        break;
    }
  }
  work(pending);  // every send arrived: each stands for a wait (mirrored_waits)
  *end = sg4::Engine::get_clock();
  *peak_out = flight.peak;
}

/* Why every host's place is not like rank 0's on this platform, or "": rank 0 stands for all
 * only where each host is as fast and has as many cores, each route from h0 is h0's own link
 * up and the other host's own link down, all alike, and a message loads no link the other
 * way (SimGrid's cross-traffic: rank 0's link up would then carry the acknowledgements of
 * every message sent to it, which rank 0 alone never sends). The cluster of
 * experiments/simulation/platforms.py is such a platform; the fat tree and the torus are not. */
static std::string not_alike(const std::vector<sg4::Host*>& hosts)
{
  if (simgrid::config::get_value<bool>("network/crosstraffic"))
    return "messages load the links the other way (--cfg=network/crosstraffic:0)";
  std::vector<sg4::Link*> first;
  std::set<sg4::Link*> downs;
  for (size_t j = 1; j < hosts.size(); j++) {
    if (hosts[j]->get_speed() != hosts[0]->get_speed() ||
        hosts[j]->get_core_count() != hosts[0]->get_core_count())
      return "host " + hosts[j]->get_name() + " is not like h0";
    std::vector<sg4::Link*> links;
    double latency = 0;
    hosts[0]->route_to(hosts[j], links, &latency);
    if (j == 1)
      first = links;
    if (links.size() != 2 || links[0] != first[0] || links[1] == links[0] ||
        !downs.insert(links[1]).second ||
        links[0]->get_bandwidth() != links[1]->get_bandwidth() ||
        links[0]->get_latency() != links[1]->get_latency())
      return "the route to " + hosts[j]->get_name() + " is not h0's link up and its own down, alike";
  }
  return "";
}

/* A mirrored recording (mirror.hpp): rank 0 alone, every rank's end and peak its own. */
static int replay_mirrored(sg4::Engine& e, const char* platform, const Recording& input)
{
  std::vector<int> stands;
  const std::string unpaired = mirrored_waits(input.moves[0], input.ranks, stands);
  if (!unpaired.empty()) {
    std::fprintf(stderr, "error: %s\n", unpaired.c_str());
    return 3;
  }
  e.load_platform(platform);
  if (e.get_host_count() < (size_t)input.ranks) {
    std::cerr << "error: the platform has fewer hosts than the recording's " << input.ranks << " ranks\n";
    return 2;
  }
  std::vector<sg4::Host*> hosts(input.ranks);
  for (int r = 0; r < input.ranks; r++)
    if ((hosts[r] = e.host_by_name_or_null("h" + std::to_string(r))) == nullptr) {
      std::cerr << "error: the platform has no host h" << r << "\n";
      return 2;
    }
  const std::string unlike = not_alike(hosts);
  if (!unlike.empty()) {
    std::cerr << "error: rank 0 cannot stand for all here: " << unlike << "\n";
    return 2;
  }
  double end = -1, peak = 0;
  sg4::Actor::create("rank0", hosts[0], mirror_main, std::cref(input.moves[0]), std::cref(stands),
                     std::cref(hosts), input.flops_per_second, &end, &peak);
  e.run();
  if (end < 0) {
    std::fprintf(stderr, "error: rank 0 never finished: it waits for a message nobody sends\n");
    return 3;
  }
  std::printf("time %.9g\n", sg4::Engine::get_clock());
  for (int r = 0; r < input.ranks; r++)
    std::printf("rank %d %.9g %.17g\n", r, end, peak);
  return 0;
}
