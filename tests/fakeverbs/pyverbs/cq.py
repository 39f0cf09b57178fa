import os
import threading
from collections import deque
from dataclasses import dataclass

from pyverbs import enums as e
from pyverbs.pyverbs_error import PyverbsRDMAError

_STATUS = {v: k[len("IBV_WC_"):].lower().replace("_", " ") for k, v in vars(e).items()
           if k.startswith("IBV_WC_") and k.endswith("ERR") or k == "IBV_WC_SUCCESS"}


def cqe_status_to_str(status: int) -> str:
    return _STATUS.get(status, f"unknown status {status}")


@dataclass
class WC:
    wr_id: int = 0
    status: int = 0
    opcode: int = 0
    vendor_err: int = 0
    byte_len: int = 0
    qp_num: int = 0
    imm_data: int = 0
    wc_flags: int = 0
    release: int = 0  # not pyverbs': send-queue slots this completion gives back


class CompChannel:
    """A pipe stands in for the uverbs event file; `fd` is what select() waits on."""

    def __init__(self, ctx) -> None:
        self.fd, self._w = os.pipe()

    def get_cq_event(self, cq: "CQ") -> None:
        os.read(self.fd, 1)

    def close(self) -> None:
        for fd in (self.fd, self._w):
            try:
                os.close(fd)
            except OSError:
                pass


class CQ:
    def __init__(self, ctx, cqe: int, cq_context=None, channel=None, comp_vector: int = 0) -> None:
        self.capacity = cqe
        self.entries: deque[WC] = deque()
        self.lock = threading.Lock()
        self.overrun = False
        self.channel = channel
        self.armed = False

    def req_notify(self, solicited_only: bool = False) -> None:
        with self.lock:
            self.armed = True

    def ack_events(self, num_events: int) -> None:
        pass

    def push(self, wc: WC) -> None:
        with self.lock:
            if len(self.entries) >= self.capacity:
                self.overrun = True  # a real CQ overrun is a fatal async event
                return
            self.entries.append(wc)
            if self.armed and self.channel is not None:
                self.armed = False
                os.write(self.channel._w, b"e")

    def poll(self, num_entries: int = 1) -> tuple[int, list[WC]]:
        with self.lock:
            if self.overrun:
                raise PyverbsRDMAError("Failed to poll CQ (overrun)", 5)
            out = [self.entries.popleft() for _ in range(min(num_entries, len(self.entries)))]
        for wc in out:
            if wc.release:
                from pyverbs import _fabric

                _fabric.FABRIC.release(wc.qp_num, wc.release)
        return len(out), out

    def close(self) -> None:
        pass
