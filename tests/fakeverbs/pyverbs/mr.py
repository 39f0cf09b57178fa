import ctypes

from pyverbs import _fabric
from pyverbs.pyverbs_error import PyverbsRDMAError


class MR:
    """Registered memory: the caller's (address=) or our own. Keys are unique in the fabric;
    a closed MR's keys stop working at once, as a deregistered one's do."""

    def __init__(self, pd, length: int, access: int, address: int | None = None) -> None:
        if length <= 0:
            raise PyverbsRDMAError("Failed to register a MR", 22)
        self._own = None
        if address is None:
            self._own = ctypes.create_string_buffer(length)
            address = ctypes.addressof(self._own)
        self.buf, self.length, self.access = address, length, access
        self.lkey = self.rkey = _fabric.FABRIC.register(self)

    def read(self, length: int, offset: int) -> bytes:
        return ctypes.string_at(self.buf + offset, length)

    def write(self, data: bytes, length: int, offset: int = 0) -> None:
        ctypes.memmove(self.buf + offset, data, length)

    def close(self) -> None:
        _fabric.FABRIC.deregister(self)
