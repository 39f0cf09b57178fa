"""Elastic membership, below the communicator and generic in what it builds: after a rank dies
the survivors agree on who is left and go on in a new communicator (shrink, as ULFM's
MPIX_Comm_shrink); between steps a running job lets newcomers in (admit, and join on the
newcomer's side). MPI, Gloo and NCCL end the job instead.

Every rank of an elastic job keeps a listener for the job's life, served by a thread of its own
(rxelab.control.server: rank 0's is the job's rendezvous), and knows where the others listen. Every
connection between them is proven both ways and sealed (rxelab.control.handshake): a process without the
job's secret can neither answer for a rank, nor coordinate a shrink, nor learn the secret.
A shrink needs no rank in particular to have survived:

- The coordinator is the lowest old rank whose listener still answers, proven: each survivor
  tries them in order, and a refused connection, a listener that cannot prove itself (a
  stranger on a dead rank's port), or one that gives no proof for a few seconds (a stranger
  that takes connections and closes them) moves it on to the next (rxelab.control.liveness). A
  connect that times out is no death while heartbeats vouch for the rank (a flood of
  connects fills a live listener's queue): that one is tried again, up to SILENT_S after it
  was last heard (then it cannot be told from a powered-off node, and is gone). A live
  process keeps its listener, so every survivor finds the same one.
- The coordinator waits for each old rank to come, or to be found dead: it probes the
  listeners of those that have not come (a proven answer means alive), the same way. At the
  deadline a rank that never proved it lives, nor was heard by its heartbeats, is gone; one
  that did is named in the error. Views of who died may differ; its decision is the one set
  everybody takes. A rank that dies during the agreement
  (its connection closes) is counted dead; a coordinator that dies before or after deciding
  sends its survivors to the next one at once (nothing listens where it did).
- Unless told otherwise, the survivors go on only as a majority of the old communicator (or
  exactly half holding its lowest rank): in a network partition one side at most carries on,
  and the other is told why it stopped.
- The new communicator is built as init() builds one (its rank 0, the coordinator, serves the
  exchange on its listener): ranks renumbered densely in the old order, a fresh mesh of RC
  QPs, nothing of the old one left. If a member dies while it is built, the agreement runs
  again among those decided.

A newcomer is taken in only if it proved the secret, has the job's settings (else it is
refused and the job is left as it was), and accepted the offer while it still waited
(rxelab.membership.newcomers).

No collective is ever in flight across a change: shrink and admit are called by the
application between collectives, on every rank; the collective a failure interrupted has an
undefined result everywhere and is redone on the new communicator.
"""

from rxelab.membership.admitting import Member, admit
from rxelab.membership.agreement import shrink
from rxelab.membership.newcomers import MAX_NEWCOMERS, knock
from rxelab.membership.seat import Build, Formed, Seat, check_quorum, deadline_of, quorate

__all__ = ["MAX_NEWCOMERS", "Build", "Formed", "Member", "Seat", "admit", "check_quorum",
           "deadline_of", "knock", "quorate", "shrink"]
