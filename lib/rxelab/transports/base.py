"""What the engine asks of a transport, in pure Python: the libibverbs numbers it posts and
reads back, and the shapes of the objects it drives.

The engine was written against RC verbs, so every transport speaks verbs' vocabulary: work
requests with a wr_id, completions with a status, registrations with lkey and rkey, one
ordered connection per peer with receive slots. Keeping the numbers as libibverbs has them
lets the verbs transport hand pyverbs' own objects to the engine with no wrapper on the hot
path (rxelab.verbs checks at import that pyverbs agrees), and lets a transport without pyverbs
be a drop-in (docs/design/transports.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from rxelab.control.handshake import Credential

# work requests (enum ibv_wr_opcode)
WR_RDMA_WRITE = 0
WR_RDMA_WRITE_WITH_IMM = 1
WR_SEND = 2
WR_SEND_WITH_IMM = 3

# completion statuses (enum ibv_wc_status): those the engine tests and those a transport
# without verbs reports
WC_SUCCESS = 0
WC_LOC_LEN_ERR = 1
WC_LOC_PROT_ERR = 4
WC_WR_FLUSH_ERR = 5
WC_REM_INV_REQ_ERR = 9
WC_REM_ACCESS_ERR = 10
WC_RETRY_EXC_ERR = 12

# completion opcodes (enum ibv_wc_opcode) and flags (enum ibv_wc_flags)
WC_RECV = 128
WC_RECV_RDMA_WITH_IMM = 129
WC_WITH_IMM = 2

# registration access (enum ibv_access_flags)
ACCESS_LOCAL_WRITE = 1
ACCESS_REMOTE_WRITE = 2
ACCESS_REMOTE = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE

# each number above under libibverbs' own name, as pyverbs.enums spells it
ABI = {
    "IBV_WR_RDMA_WRITE": WR_RDMA_WRITE, "IBV_WR_RDMA_WRITE_WITH_IMM": WR_RDMA_WRITE_WITH_IMM,
    "IBV_WR_SEND": WR_SEND, "IBV_WR_SEND_WITH_IMM": WR_SEND_WITH_IMM,
    "IBV_WC_SUCCESS": WC_SUCCESS, "IBV_WC_LOC_LEN_ERR": WC_LOC_LEN_ERR,
    "IBV_WC_LOC_PROT_ERR": WC_LOC_PROT_ERR, "IBV_WC_WR_FLUSH_ERR": WC_WR_FLUSH_ERR,
    "IBV_WC_REM_INV_REQ_ERR": WC_REM_INV_REQ_ERR, "IBV_WC_REM_ACCESS_ERR": WC_REM_ACCESS_ERR,
    "IBV_WC_RETRY_EXC_ERR": WC_RETRY_EXC_ERR, "IBV_WC_RECV": WC_RECV,
    "IBV_WC_RECV_RDMA_WITH_IMM": WC_RECV_RDMA_WITH_IMM, "IBV_WC_WITH_IMM": WC_WITH_IMM,
    "IBV_ACCESS_LOCAL_WRITE": ACCESS_LOCAL_WRITE, "IBV_ACCESS_REMOTE_WRITE": ACCESS_REMOTE_WRITE,
}


def abi_differences(enums: Any) -> list[str]:
    """Where a module of libibverbs' enums (pyverbs.enums) disagrees with ABI, in words."""
    out = []
    for name, ours in ABI.items():
        theirs = getattr(enums, name, None)
        if theirs is None:
            out.append(f"{name} is missing")
        elif int(theirs) != ours:
            out.append(f"{name} is {int(theirs)}, not {ours}")
    return out


class Completion(Protocol):
    """One completion, with pyverbs' WC's fields."""

    wr_id: int
    status: int
    opcode: int
    vendor_err: int
    byte_len: int
    imm_data: int
    wc_flags: int


class CompletionQueue(Protocol):
    def poll(self, n: int) -> tuple[int, Sequence[Completion]]:
        """Up to n completions; never blocks."""


class Device(Protocol):
    """What the engine and its waits hold as self.dev: the queue and how to sleep on it."""

    @property
    def cq(self) -> CompletionQueue: ...
    @property
    def channel_fd(self) -> int | None:
        """Readable once armed and a completion came; None: the engine sleep-polls."""
    def arm(self) -> None: ...
    def take_event(self) -> None: ...
    def status_str(self, status: int) -> str: ...
    def close(self) -> None: ...


class Endpoint(Protocol):
    """What a peer needs to reach one of our connections, as the control plane carries it."""

    def to_dict(self) -> dict[str, Any]: ...


class SlotState:
    """The engine's bookkeeping of one connection's send slots, kept on the connection."""

    def __init__(self, slots: int) -> None:
        self.free_send_slots = list(range(slots))
        # signaled send slot -> (its SendOp, the unsignaled slots posted before it, and the
        # eager bytes of all of them)
        self.slot_ops: dict[int, tuple[Any, list[int], int]] = {}
        self.unsignaled: list[int] = []  # slots posted without a completion of their own
        self.unsignaled_bytes = 0  # eager bytes among them


class Connection(Protocol):
    """One reliable, ordered connection to one peer with RC's semantics: completions only for
    signaled sends (each answering for the unsignaled ones before it), a send that finds no
    posted receive waits with everything behind it, a write outside a live remote-writable
    registration fails at its sender."""

    peer: int
    slot_size: int
    send_base: int
    recv_base: int
    send_mr: Any
    free_send_slots: list[int]
    slot_ops: dict[int, tuple[Any, list[int], int]]
    unsignaled: list[int]
    unsignaled_bytes: int

    def endpoint(self) -> Endpoint: ...
    def post(self, wr_id: int, opcode: int, addr: int, length: int, lkey: int,
             remote_addr: int = 0, rkey: int = 0, imm: int = 0, signaled: bool = True) -> None: ...
    def repost(self, slot: int) -> None: ...
    def slot_bytes(self, slot: int, length: int) -> bytes: ...
    def close(self) -> None: ...


@dataclass(frozen=True)
class Meeting:
    """What connecting to the peers needs beside their endpoints."""

    rank: int
    generation: int
    scope: str  # the job's id: a data connection of another job is refused
    credential: Credential  # what a data connection's ends prove (tcp, quic)
    deadline: float  # time.monotonic()
    qp_timeout: int  # verbs' ack timeout and retries
    retry_cnt: int


class Fabric(Protocol):
    """What a transport opens for one communicator."""

    name: str

    @property
    def device(self) -> Device: ...
    def register(self, address: int, nbytes: int, access: int) -> Any: ...
    def connection(self, registry: Any, peer: int, slots: int, send_depth: int,
                   slot_size: int) -> Connection: ...
    def connect(self, remote: dict[int, dict[str, Any]], meeting: Meeting) -> None:
        """Every connection made (connection()) to its peer, whose endpoint is in `remote`."""
    def close(self) -> None: ...
