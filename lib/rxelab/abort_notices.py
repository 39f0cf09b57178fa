"""An abort notice that arrived over RDMA, checked before this rank uses any of it (as every
control-plane message is); rxelab.engine files what read() returns.

A notice says why its sender stopped (a Reason, or MISMATCH: messages.AbortReason, as its
code in the control message's rkey, messages.ABORT_CODE), the rank it blames (in addr: that
rank + 1; 0 for none) and, after the control message, the mismatch that started it all
where one did (messages.CAUSE). What its senders send (rxelab.comm.guard.fail,
Engine.post_aborts), and so what is checked:
- the blamed rank and the mismatch's two ranks are ranks of the job (below its size);
- the mismatch's two ranks differ, and so do its two sizes (unsigned on the wire: never
  negative); sizes that agree are no mismatch;
- a mismatch comes with MISMATCH, from one of its two ranks, blaming the other (the rank that
  found it, or was told it), or with Reason.FAILED, from any rank (a bystander passes it
  on);
- codec and length are 0.
A notice that breaks any of it is malformed: its sender did stop (the kind and the version
are right), but nothing else in it can be believed. It is filed as its sender's notice that
names what was wrong, blames nobody and carries no mismatch: the call stops with one clear
error ("rank 0 stopped the operation (its abort notice is malformed: ...)"), and nothing of
it goes further (into this rank's own notices, or the control plane's abort, which refuses a
rank out of range and would leave the job untold)."""

from __future__ import annotations

from rxelab.errors import Mismatch, ProtocolError, Reason
from rxelab.messages import ABORT_REASON, ABORT_WORDS, CAUSE, MISMATCH
from rxelab.waits import Notice


def read(peer: int, size: int, code: int, addr: int, codec: int = 0, nbytes: int = 0,
         cause: bytes = b"") -> Notice:
    """The notice rank `peer` sent, in a job of `size` ranks (`code` and the rest: the fields
    of its control message, `cause` what came after it); a malformed one as a notice
    that says so (parse() says why)."""
    try:
        return parse(peer, size, code, addr, codec, nbytes, cause)
    except ProtocolError as err:
        return Notice(f"its abort notice is malformed: {err}", Reason.FAILED, None)


def parse(peer: int, size: int, code: int, addr: int, codec: int = 0, nbytes: int = 0,
          cause: bytes = b"") -> Notice:
    """The notice, its reason in words; ProtocolError where a field is not what a sender
    sends (the module's docstring)."""
    def rank(r: int, what: str) -> int:
        if not 0 <= r < size:
            raise ProtocolError(f"{what} rank {r} is not one of the {size} ranks")
        return r

    if code not in ABORT_REASON:
        raise ProtocolError(f"unknown reason code {code}")
    why = ABORT_REASON[code]
    if codec or nbytes:
        raise ProtocolError(f"an abort carries no codec or length (codec {codec}, length {nbytes})")
    blamed = rank(addr - 1, "the blamed") if addr else None
    m = None
    if cause:
        if len(cause) != CAUSE.size:
            raise ProtocolError(f"a cause of {len(cause)} bytes, expected {CAUSE.size}")
        m = Mismatch(*CAUSE.unpack(cause))
        rank(m.sender, "the mismatch's sending")
        rank(m.receiver, "the mismatch's receiving")
        if m.sender == m.receiver:
            raise ProtocolError(f"a mismatch of rank {m.sender} with itself")
        if m.sent == m.expected:  # both unsigned on the wire: never negative
            raise ProtocolError(f"a mismatch of {m.sent} bytes both sent and expected")
        if why == MISMATCH:
            if peer not in (m.sender, m.receiver):
                raise ProtocolError(f"rank {peer} is neither the sender nor the receiver of "
                                    f"the mismatch it tells (rank {m.sender} to {m.receiver})")
            if blamed != m.other(peer):
                raise ProtocolError(f"its mismatch is with rank {m.other(peer)}, yet it blames "
                                    + ("no rank" if blamed is None else f"rank {blamed}"))
        elif why != Reason.FAILED:
            raise ProtocolError(f"it carries a cause with code {code} ({ABORT_WORDS[why]}): "
                                "only a mismatch or a failure passed on does")
    words = ABORT_WORDS[why]
    if blamed is not None and why == Reason.FAILED:  # another's failure it passes on: whose
        words = words if blamed == peer else f"rank {blamed} stopped"
    elif blamed is not None:
        words = f"{words} rank {blamed}"
    return Notice(words, why, blamed, m)
