/* Replays rxelab.trace recordings on a SimGrid platform (s4u, SimGrid 3.32): one actor per
 * rank. Every pair of ranks has a mailbox whose permanent receiver is the receiving rank, so a
 * message moves as soon as it is sent, as an RDMA write or send into a buffer the receiver
 * posted ahead does; the receiver takes a pair's messages in the order they were sent (RC's),
 * files them by key, and a wait takes the one it needs. A rank's CPU work (per
 * message overheads, copies, reductions) is computation on its host, so ranks that share a
 * host's cores compete for them (the lab: ranks on one VM share its CPU).
 *
 * Input (text, written by experiments/simulation/replayer.py):
 *   ranks P hosts H per K flops F
 *                            rank r runs on host "h<r / K>"; a second of CPU work is F flops
 *                            (a host slower than F flop/s per core takes longer)
 *   vms C B L F W            (optional: the lab) the hosts are VMs of C cores each on the
 *                            platform's one machine, whose cores they share as they are busy;
 *                            a message's bytes cost B seconds each on the sender's VM and on
 *                            the receiver's at once (under TCG rxe's data path is the VMs'
 *                            CPU), and F seconds each through each side's data path (a
 *                            resource of each VM, not the machine's cores: its sends and
 *                            receives share it; 0: none);
 *                            L on the one VM of two ranks of one VM (once: both
 *                            sides are on it), then cross the machine's loopback (the
 *                            link's latency); no porters then: each message has a carrier;
 *                            W: the CPU a blocked rank spends to run again (lab_vms.hpp)
 *   mirror                   (optional: hosts of one rank each, no VMs) rank 0's moves alone
 *                            stand for every rank's (mirror.hpp)
 *   rank r N                 then N moves of rank r:
 *   S dst bytes key waited data cpu  a message (key names it for the receiver, its top 16
 *                                 bits the sender's rank; waited: a
 *                                 later W names it by this rank's count of its S lines; data:
 *                                 1 for a block's bytes, 0 for a control message)
 *   R key cpu                     wait for the message of that key, then cpu seconds of work
 *   W n id...                     wait until these sends have arrived (with VMs: and
 *                                 their acknowledgements have come back, a latency later:
 *                                 RC's send completes by the peer's acknowledgement)
 *   C cpu                         local work
 * Output: "time <simulated seconds>", "rank <r> <its end> <peak bytes in flight>" lines;
 * exit status 3 when a
 * rank never finished (a wait whose message nobody sends: SimGrid ends such a run) or ended
 * with messages it never waited for; 2 for input that is not a well-formed recording. */
#include <simgrid/s4u.hpp>
#include <xbt/config.hpp>

#include "in_flight.hpp"
#include "lab_vms.hpp"
#include "mirror.hpp"
#include "recording.hpp"

#include <algorithm>
#include <deque>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

static std::vector<std::vector<Move>> moves;
static std::vector<sg4::Host*> rank_host;
static std::vector<double> ended;
static std::vector<double> peak_inflight;  // per rank (in_flight.hpp)
static std::vector<char> unclaimed;  // a rank that ended with messages nobody waited for
// messages sent to each rank and waited for by it: a porter's send still on its way when the
// ranks end is cancelled with the porter, so the mailbox alone cannot tell
static std::vector<long long> sent_to, claimed;

/* Sends nobody waits for leave through porters. SimGrid 3.32 keeps every activity an actor
 * takes part in on a list it scans whole whenever one of them ends (std::list::remove, in
 * CommImpl::finish and ExecImpl::post), and a detached send stays on its sender's list (and its
 * receiver's) until it arrives: a parallel all-to-all, every rank sending to all p - 1 peers at
 * once, made every arrival and every CPU step cost O(p), the call O(p^3) with a cache miss per
 * step. Instead a rank hands such a send to one of its PORTERS, actors on its host that post
 * it at the same simulated instant and hold it (not detached) until a test finds it arrived;
 * the rank's own list stays short, and each porter's holds at most p / PORTERS sends. The
 * simulated times are the same to the last digit (p = 16, 256, 512 checked against the
 * detached version); the parallel all-to-all at p = 512 went from about 60 s to 20 s. */
struct Job {
  sg4::Mailbox* to;
  unsigned long long* payload;
  uint64_t wire;
  int id = -1;  // a send its rank waits for (a crowded rank's): its id, else -1
};
struct Porter {
  std::deque<Job> jobs;
  sg4::SemaphorePtr ready;  // one token per job handed (a semaphore: no lock to own or unwind)
};
static std::vector<std::vector<Porter>> porters;
/* A rank that keeps many sends it waits for on the wire at once (CROWDED: the parallel
 * all-to-all by rendezvous, p - 1 writes) has its porters post them too, and waits for each
 * itself on the handle its porter leaves: an activity is on the list of the actor that posted
 * it, not of one that waits for it. Posted by the rank, they made each of its arrivals and CPU
 * steps cost O(p) (std::list::remove: 64 % of the replay at p = 512, 1 MiB; 157 s at
 * p = 1024, now 36 s). Tried first: a carrier actor per such send, as the lab's VMs have
 * (71 s at p = 1024, but 9 GB: an actor and its stack per message on the wire, past the
 * simulator's memory cap once stacks were counted). A rank with few (pairwise: one at a
 * time) posts them itself: a hand-over costs two context switches. The simulated times are
 * the same to the last digit either way. */
static const int CROWD = 16;  // waited sends on the wire at once from which a rank uses porters
static std::vector<char> crowded;
struct Handed {  // a crowded rank's send that it waits for, posted by a porter
  sg4::CommPtr comm;
  bool posted = false;  // by the porter
  bool done = false;    // waited for by the rank
};
static std::vector<std::vector<Handed>> handed;  // [rank][send id]
static std::vector<int> awaiting;  // the send a rank waits to see posted, or -1
static std::vector<sg4::SemaphorePtr> posted_ready;
static const int PORTERS = 4;  // per rank (more only added actors: 8 was slower than 4 at p = 512)

static void porter_main(int r, int k)
{
  Porter& me = porters[r][k];
  std::deque<sg4::CommPtr> posted;
  for (;;) {
    me.ready->acquire();  // not suspend(): a suspended actor's sends would stop moving
    Job job = me.jobs.front();
    me.jobs.pop_front();
    if (job.id >= 0) {  // the rank waits for it itself (rank_main, 'W'): it takes the handle
      Handed& h = handed[r][job.id];
      h.comm = job.to->put_async(job.payload, job.wire);
      h.posted = true;
      if (awaiting[r] == job.id) {
        awaiting[r] = -1;
        posted_ready[r]->release();
      }
    } else {
      posted.push_back(job.to->put_async(job.payload, job.wire));
    }
    while (!posted.empty() && posted.front()->test())
      posted.pop_front();
  }
}

/* A mailbox per pair of ranks (sender, receiver), made when first used, with the receiver as
 * its permanent receiver. SimGrid 3.32 files a message to a permanent receiver when it is
 * posted and hands them out first in, first out, a get waiting for the oldest: with one mailbox
 * per rank, a rank waiting for one peer's message also waited for every message posted to it
 * before, from anyone. Per pair that order is RC's own (a queue pair delivers in order). It
 * also spares the parallel all-to-all a third of its replay at p = 1024: each get erases the
 * front of a boost::circular_buffer_space_optimized, shifting everything behind it, and a rank
 * that sends all its blocks before taking any had p - 1 waiting in one. (16 mailboxes a rank,
 * by sender mod 16, were faster still, 1.09-1.28x, but only narrowed the wrong order.) */
static std::vector<sg4::ActorPtr> rank_actor;
static std::vector<sg4::Mailbox*> pair_boxes;  // [receiver * p + sender]

static sg4::Mailbox* pair_box(int to, int from)
{
  sg4::Mailbox*& box = pair_boxes[(size_t)to * rank_actor.size() + (size_t)from];
  if (box == nullptr) {
    box = sg4::Mailbox::by_name("r" + std::to_string(to) + "." + std::to_string(from));
    box->set_receiver(rank_actor[to]);
  }
  return box;
}

static void work(double seconds)
{
  if (seconds > 0)
    sg4::this_actor::execute(seconds * flops_per_second);
}

static void rank_main(int r)
{
  std::unordered_map<unsigned long long, int> arrived;
  std::vector<sg4::CommPtr> sends;
  std::vector<sg4::ActorPtr> carried;  // with VMs: the carrier of each send (waited ones)
  InFlight flight;
  std::vector<char> by_porter;  // a send this rank waits for, posted by a porter (crowded)
  /* CPU work is run when the rank next sends, waits or ends, as one exec: one after another on
   * a busy CPU they take the same time, and each exec is a SimGrid action of its own (a fifth
   * of the replay's time went to starting and ending them). */
  double pending = 0;
  sg4::Host* const here = rank_host[r];
  want_core(here);  // a rank runs but while it waits (blocked: the library sleeps at once)
  for (const Move& m : moves[r]) {
    switch (m.kind) {
      case 'S': {
        work(pending + m.cpu);
        pending = 0;
        flight.sent(m);
        by_porter.push_back(vm_cores == 0 && m.waited && crowded[r]);
        sent_to[m.peer]++;
        auto* payload = new unsigned long long(m.key);
        sg4::Mailbox* to = pair_box(m.peer, r);
        // a message of 0 bytes still crosses the link (SimGrid would deliver it at once)
        auto wire = (uint64_t)std::max(m.bytes, 1.0);
        if (vm_cores > 0) {
          sends.push_back(nullptr);
          sg4::ActorPtr carrier = sg4::Actor::create("carry", rank_host[r], carry, to, payload, wire,
                                                     rank_host[m.peer], m.waited);
          carried.push_back(m.waited ? carrier : nullptr);
        } else if (by_porter.back()) {
          sends.push_back(nullptr);
          Porter& porter = porters[r][m.peer % PORTERS];
          porter.jobs.push_back({to, payload, wire, (int)flight.bytes.size() - 1});
          porter.ready->release();
        } else if (m.waited) {
          sends.push_back(to->put_async(payload, wire));
        } else {
          sends.push_back(nullptr);
          Porter& porter = porters[r][m.peer % PORTERS];
          porter.jobs.push_back({to, payload, wire});
          porter.ready->release();
        }
        if (vm_cores == 0)
          carried.push_back(nullptr);
        break;
      }
      case 'R': {
        auto it = arrived.find(m.key);
        sg4::Mailbox* box = pair_box(r, (int)(m.key >> 48));
        if (it == arrived.end()) {  // the work before it is done before it waits
          work(pending);
          pending = 0;
        }
        const bool blocked = it == arrived.end();
        const double since = sg4::Engine::get_clock();
        if (blocked)
          drop_core(here);
        while (it == arrived.end()) {
          auto* got = box->get<unsigned long long>();
          arrived[*got]++;
          delete got;
          it = arrived.find(m.key);
        }
        if (blocked) {
          want_core(here);
          woken(since);
        }
        if (--it->second == 0)
          arrived.erase(it);
        claimed[r]++;
        flight.polled();
        pending += m.cpu;
        break;
      }
      case 'W': {
        work(pending);
        pending = 0;
        const double since = sg4::Engine::get_clock();
        drop_core(here);
        for (int id : m.ids)
          if (by_porter[id]) {
            Handed& h = handed[r][id];
            if (h.done)
              continue;
            if (!h.posted) {  // its porter has not run yet at this instant
              awaiting[r] = id;
              posted_ready[r]->acquire();
            }
            // not wait(): a waiter that is neither end of a running comm gets a sleep action
            // filed as the receiver's, over the receiver's own (leaked; SimGrid 3.32's
            // ActivityImpl::wait_for); wait_any without a timeout makes none
            sg4::Comm::wait_any(std::vector<sg4::CommPtr>{h.comm});
            h.comm = nullptr;
            h.done = true;
            flight.waited_for(id);
          } else if (sends[id]) {
            sends[id]->wait();
            sends[id] = nullptr;  // done: its memory goes now, not at the rank's end
            flight.waited_for(id);
          } else if (carried[id]) {
            carried[id]->join();
            carried[id] = nullptr;
            flight.waited_for(id);
          }
        flight.polled();
        want_core(here);
        woken(since);
        break;
      }
      case 'C':
        pending += m.cpu;
        break;
    }
  }
  work(pending);
  drop_core(here);
  if (!arrived.empty())  // a message this rank never waited for: the recording is wrong
    unclaimed[r] = 1;
  ended[r] = sg4::Engine::get_clock();
  peak_inflight[r] = flight.peak;
}

int main(int argc, char** argv)
{
  bool stack_given = false;
  for (int i = 1; i < argc; i++)
    stack_given |= std::string(argv[i]).find("contexts/stack-size") != std::string::npos;
  sg4::Engine e(&argc, argv);
  // 5 actors per rank (with VMs, 1 and one per message on its way): 8 MiB stacks each (the
  // default) would be 40 GiB of mappings at p = 1024
  if (!stack_given)
    sg4::Engine::set_config("contexts/stack-size:256");
  if (argc != 3) {
    std::cerr << "usage: " << argv[0] << " platform.xml trace.txt [--cfg=...]\n";
    return 2;
  }
  Recording input;
  try {
    input = read_recording(argv[2]);
  } catch (const std::exception& err) {
    std::cerr << "error: " << err.what() << "\n";
    return 2;
  }
  const int hosts = input.hosts, per = input.per;
  flops_per_second = input.flops_per_second;
  vm_cores = input.vm_cores;
  byte_cpu = input.byte_cpu;
  loop_byte_cpu = input.loop_byte_cpu;
  path_byte = input.path_byte;
  wake = input.wake;
  if (vm_cores > 0)
    ack_latency = simgrid::config::get_value<double>("network/loopback-lat");
  if (input.mirror)
    return replay_mirrored(e, argv[1], input);
  moves = std::move(input.moves);
  const size_t p = moves.size();
  ended.assign(p, -1.0);
  peak_inflight.assign(p, 0.0);
  unclaimed.assign(p, 0);
  sent_to.assign(p, 0);
  claimed.assign(p, 0);
  crowded.assign(p, 0);
  handed.assign(p, {});
  awaiting.assign(p, -1);
  for (size_t r = 0; r < p; r++) {
    crowded[r] = most_waited_at_once(moves[r]) >= CROWD;
    if (crowded[r])  // by send id
      handed[r].resize(std::count_if(moves[r].begin(), moves[r].end(),
                                     [](const Move& m) { return m.kind == 'S'; }));
  }
  std::vector<sg4::Host*> vms;
  porters.resize(moves.size());
  posted_ready.resize(moves.size());
  pair_boxes.assign(moves.size() * moves.size(), nullptr);
  e.load_platform(argv[1]);
  if (vm_cores > 0) {  // the lab: its VMs, on the platform's machine, and their data paths
    std::string why;
    vms = start_vms(e, hosts, why);
    if (vms.empty()) {
      std::cerr << "error: " << why << "\n";
      return 2;
    }
  }
  rank_host.resize(moves.size());
  rank_actor.resize(moves.size());
  for (int r = 0; r < (int)moves.size(); r++) {
    sg4::Host* host = vm_cores > 0 ? vms[r / per] : e.host_by_name_or_null("h" + std::to_string(r / per));
    rank_host[r] = host;
    if (host == nullptr) {
      std::cerr << "error: the platform has no host h" << r / per << "\n";
      return 2;
    }
    rank_actor[r] = sg4::Actor::create("rank" + std::to_string(r), host, rank_main, r);
    if (vm_cores > 0)
      continue;  // the lab's messages have carriers of their own
    posted_ready[r] = sg4::Semaphore::create(0);
    porters[r].resize(PORTERS);
    for (int k = 0; k < PORTERS; k++) {
      porters[r][k].ready = sg4::Semaphore::create(0);
      sg4::Actor::create("porter" + std::to_string(r) + "." + std::to_string(k), host, porter_main, r, k)
          ->daemonize();
    }
  }
  e.run();
  rank_actor.clear();  // before the engine goes: they hold its actors
  for (size_t r = 0; r < ended.size(); r++)
    if (ended[r] < 0) {  // SimGrid ends a deadlocked simulation; its blocked actors never get here
      std::fprintf(stderr, "error: rank %zu never finished: it waits for a message nobody sends\n", r);
      return 3;
    }
  for (size_t r = 0; r < unclaimed.size(); r++)
    if (unclaimed[r] || sent_to[r] != claimed[r]) {
      std::fprintf(stderr, "error: rank %zu ended with messages it never waited for\n", r);
      return 3;
    }
  std::printf("time %.9g\n", sg4::Engine::get_clock());
  for (size_t r = 0; r < ended.size(); r++)
    std::printf("rank %zu %.9g %.17g\n", r, ended[r], peak_inflight[r]);
  return 0;
}
