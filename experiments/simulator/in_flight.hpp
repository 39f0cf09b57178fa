/* A rank's bytes in flight as the library's Stats.peak_inflight counts them: sent, and not yet
 * known to have arrived (a send it waits for: until that wait; one it never waits for: until
 * the rank next waits for anything, as the library polls completions only then). Counted
 * alike by the replay of every rank (replay.cpp) and of rank 0 alone (mirror.hpp). */
#pragma once

#include "recording.hpp"

#include <algorithm>
#include <vector>

struct InFlight {
  std::vector<double> bytes;  // by send id: a block's bytes until a wait for it took them off
  double now = 0, unwaited = 0, peak = 0;

  void sent(const Move& m)
  {
    const double counted = m.data ? m.bytes : 0;  // as the library counts: blocks, not control
    bytes.push_back(counted);
    now += counted;
    if (!m.waited)
      unwaited += counted;
    peak = std::max(peak, now);
  }
  void waited_for(int id)  // the first wait for a send takes its bytes off; a later one nothing
  {
    now -= bytes[id];
    bytes[id] = 0;
  }
  void polled()  // the rank waited for something: the sends nobody waits for are known done
  {
    now -= unwaited;
    unwaited = 0;
  }
};
