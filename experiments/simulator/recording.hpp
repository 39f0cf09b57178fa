/* The replayer's input (written by experiments/simulation/replayer.py; its format is in
 * replay.cpp's opening comment), read and checked whole before any simulation starts: a
 * recording that is not well formed is refused with the rank and the reason, never replayed
 * in part. No SimGrid here: what the moves are, not how they are simulated. */
#pragma once

#include <algorithm>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

struct Move {
  char kind;
  int peer = 0;
  double bytes = 0;
  unsigned long long key = 0;
  bool waited = false;
  bool data = false;
  double cpu = 0;
  std::vector<int> ids;
};

static const int MAX_RANKS = 1 << 16;  // a message's key holds its sender in 16 bits

struct Recording {
  int ranks = 0, hosts = 0, per = 1;  // rank r runs on host r / per
  double flops_per_second = 1e9;
  int vm_cores = 0;          // 0: the hosts are the platform's own (no VMs)
  double byte_cpu = 0;       // seconds per byte on each side, with VMs
  double loop_byte_cpu = 0;  // seconds per byte between two ranks of one VM
  double path_byte = 0;      // seconds per byte through a VM's data path, beside the CPU
  double wake = 0;           // CPU a blocked rank spends to run again, crowded, all wanted
  bool mirror = false;       // the moves are rank 0's alone, standing for all (mirror.hpp)
  std::vector<std::vector<Move>> moves;  // by rank
};

/* The most sends a rank waits for that are on the wire at once (sent, not yet waited for). */
inline size_t most_waited_at_once(const std::vector<Move>& mine)
{
  std::vector<char> open;
  size_t now = 0, most = 0;
  for (const Move& m : mine) {
    if (m.kind == 'S') {
      open.push_back(m.waited);
      now += m.waited;
      most = std::max(most, now);
    } else if (m.kind == 'W') {
      for (int id : m.ids)
        if (open[id]) {
          open[id] = 0;
          now--;
        }
    }
  }
  return most;
}

/* Throws std::runtime_error saying what is wrong, and where. */
inline Recording read_recording(const char* path)
{
  Recording t;
  std::ifstream in(path);
  std::string word;
  int& p = t.ranks;
  if (!(in >> word >> p >> word >> t.hosts >> word >> t.per >> word >> t.flops_per_second) ||
      p <= 0 || t.hosts <= 0 || t.per <= 0 || (long long)t.hosts * t.per < p ||
      !(t.flops_per_second > 0))
    throw std::runtime_error("trace: expected 'ranks P hosts H per K flops F', H x K >= P");
  if (p > MAX_RANKS || t.hosts > MAX_RANKS)
    throw std::runtime_error("trace: more than " + std::to_string(MAX_RANKS) + " ranks or hosts (a key's sender is 16 bits)");
  if (in >> std::ws && in.peek() == 'v') {
    if (!(in >> word >> t.vm_cores >> t.byte_cpu >> t.loop_byte_cpu >> t.path_byte >> t.wake) ||
        word != "vms" || t.vm_cores <= 0 || !(t.byte_cpu >= 0) || !(t.loop_byte_cpu >= 0) ||
        !(t.path_byte >= 0) || !(t.wake >= 0))
      throw std::runtime_error("trace: expected 'vms C B L F W', C >= 1 cores per VM, B, L and F >= 0 seconds per byte, W >= 0 seconds");
  }
  if (in >> std::ws && in.peek() == 'm') {
    if (!(in >> word) || word != "mirror" || t.vm_cores > 0 || t.per != 1)
      throw std::runtime_error("trace: 'mirror' (rank 0's moves alone) on hosts of one rank each, no VMs");
    t.mirror = true;
  }
  const int given = t.mirror ? 1 : p;
  t.moves.resize(given);
  std::vector<char> seen(given, 0);
  for (int n = 0; n < given; n++) {
    int r;
    size_t count;
    if (!(in >> word >> r >> count) || word != "rank" || r < 0 || r >= given || seen[r])
      throw std::runtime_error(t.mirror ? "trace: expected 'rank 0 N' alone"
                                        : "trace: expected 'rank r N', each rank once");
    seen[r] = 1;
    auto& mine = t.moves[r];
    mine.reserve(std::min(count, (size_t)1 << 20));  // a count past the input is cut short
    int sent = 0;
    std::vector<char> waited_flag;  // by send id: its S line's `waited`
    for (size_t i = 0; i < count; i++) {
      Move m;
      in >> m.kind;
      if (m.kind == 'S') {
        int waited, data;
        in >> m.peer >> m.bytes >> m.key >> waited >> data >> m.cpu;
        m.waited = waited != 0;
        m.data = data != 0;
        waited_flag.push_back(m.waited);
        sent++;
        if (m.peer < 0 || m.peer >= p)
          throw std::runtime_error("trace: a message to a rank that does not exist");
        if (m.bytes < 0)
          throw std::runtime_error("trace: a message of fewer than 0 bytes");
        if (in && (m.key >> 48) != (unsigned long long)r)
          throw std::runtime_error("trace: rank " + std::to_string(r) + " sends a message keyed as another rank's");
      } else if (m.kind == 'R') {
        in >> m.key >> m.cpu;
        if (in && (m.key >> 48) >= (unsigned long long)p)
          throw std::runtime_error("trace: rank " + std::to_string(r) + " waits for a rank that does not exist");
      } else if (m.kind == 'W') {
        int k = -1;
        in >> k;
        if (in && (k < 0 || k > sent))
          throw std::runtime_error("trace: rank " + std::to_string(r) + " waits for more sends than it made");
        m.ids.resize(in ? k : 0);
        for (int& id : m.ids) {
          in >> id;
          if (in && (id < 0 || id >= sent))
            throw std::runtime_error("trace: rank " + std::to_string(r) + " waits for a send it has not made");
          if (in && !waited_flag[id])
            throw std::runtime_error("trace: rank " + std::to_string(r) + " waits for a send marked as never waited for");
        }
      } else if (m.kind == 'C') {
        in >> m.cpu;
      } else {
        throw std::runtime_error(std::string("trace: unknown move '") + m.kind + "'");
      }
      if (!in)
        throw std::runtime_error("trace: cut short in rank " + std::to_string(r));
      if (m.cpu < 0)
        throw std::runtime_error("trace: CPU seconds below 0");
      mine.push_back(std::move(m));
    }
  }
  if (in >> word)
    throw std::runtime_error(t.mirror ? "trace: expected 'rank 0 N' alone"
                                      : "trace: more than the ranks' moves");
  return t;
}
