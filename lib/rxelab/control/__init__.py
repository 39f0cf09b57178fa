"""The control plane: what ranks say to each other over TCP, beside RDMA, and who may say it.

From the bottom:
- `handshake`: the job's credential (a shared secret, or MUNGE through `munge_credential`),
  the mutual challenge-response every connection opens with, and the seal on each frame after;
- `framing`: a frame's bytes and the schema of every message;
- `connection`: a connection that passed the handshake, from the dialling or the listening end;
- `accept_limits`: the bounded work a listener does for connections that proved nothing yet;
- `accepting`: a listener's connections, each taken through the handshake at once (`Acceptor`);
- `server`: a listener served by a thread of its own (`Server`), handing each request on;
- `addresses`: where a job's ranks listen and where they dial;
- `liveness`: whether a rank of an elastic job is alive (a proven probe);
- `rendezvous`: how a communicator forms (rank 0 gathers the hellos, hands out the endpoints);
- `plane`: the connections a communicator keeps for its life (barriers, goodbyes, aborts,
  heartbeats).
"""
