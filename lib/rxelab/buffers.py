"""Caller buffers as the library sees them: a contiguous run of bytes at an address.

Buffers are registered in place (no copies), so everything about them is checked before
anything is posted: contiguous, writable where data lands, equal element types on both
sides, sizes that split evenly over the ranks.
"""

from __future__ import annotations

import ctypes
import sys
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from rxelab.errors import ConfigError


@dataclass(frozen=True)
class Buffer:
    """A validated view: `owner` keeps the memory alive while the library uses it."""

    owner: Any
    address: int
    nbytes: int
    itemsize: int
    dtype: str
    writable: bool


def byte_view(buf: Buffer) -> np.ndarray:
    """The buffer's bytes as a numpy array over the same memory (for an algorithm's local
    moves: Bruck's rotations); valid while the buffer's owner is held, as a call holds it."""
    if not buf.nbytes:
        return np.empty(0, np.uint8)
    return np.ctypeslib.as_array((ctypes.c_uint8 * buf.nbytes).from_address(buf.address))


MIN_AREA = 4096  # a staging area's smallest size (rxelab.collectives.common.Staging)
DLPACK_CPU, DLPACK_CUDA_HOST = 1, 3  # host memory: plain, and CUDA's pinned host memory


def data_pointer(arr: np.ndarray) -> Any:
    """A reader of where arr's data is at each read (`.value`), holding nothing (valid while
    arr lives): the same array object can be given other memory (`a.resize(n,
    refcheck=False)` and back, `a.data = ...` before numpy 2, `a.__setstate__(...)`). It
    reads the array's own field, ~0.1 us, where `arr.ctypes.data` takes ~2.5 us."""
    if _POINTER_AT is None:
        return _CtypesPointer(arr)
    return ctypes.c_void_p.from_address(id(arr) + _POINTER_AT)


class _CtypesPointer:
    """data_pointer's reader where the field could not be found: arr.ctypes.data, by a weak
    reference (a plan counts who refers to its arrays)."""

    def __init__(self, arr: np.ndarray) -> None:
        self.arr = weakref.ref(arr)

    @property
    def value(self) -> int | None:
        arr = self.arr()
        return None if arr is None else int(arr.ctypes.data) or None


def _pointer_offset() -> int | None:
    """Where an ndarray object keeps its data pointer: just past the object's header, first
    of numpy's PyArrayObject_fields since numpy 1.0; checked here on arrays of both kinds
    (owning their memory, views), else None."""
    if sys.implementation.name != "cpython":  # an id is an address in CPython only
        return None
    at = object.__basicsize__
    probes = (np.zeros(3), np.arange(9, dtype=np.int8)[1:])
    if all(ctypes.c_void_p.from_address(id(a) + at).value == a.ctypes.data for a in probes):
        return at
    return None


_POINTER_AT = _pointer_offset()


def host_array(obj: Any, what: str) -> Any:
    """A torch CPU tensor - anything that is neither a numpy array nor a Python buffer but
    exports its memory by DLPack - as a numpy array over the same memory (no copy: what
    arrives lands in the tensor); anything else as it is. torch tensors have no buffer
    protocol, and importing torch here would cost seconds for jobs that never use it."""
    if isinstance(obj, np.ndarray) or not hasattr(obj, "__dlpack__"):
        return obj
    layout = _layout_of(obj)
    seen = _SEEN.get(id(obj)) if layout is not None else None
    if seen is not None and seen[0]() is obj and seen[1] == layout:
        arr = seen[2]()
        if arr is not None:  # the same tensor, as it was: a training loop's every call
            return arr
    arr = _import(obj, what)
    if layout is not None:
        try:
            _SEEN[id(obj)] = (weakref.ref(obj, _forget(id(obj))), layout, weakref.ref(arr))
        except TypeError:  # not weakly referable: converted every call
            pass
    return arr


# id(tensor) -> (the tensor, its layout, the array last made of it), all weakly: a cache that
# keeps nothing alive (the plans and registrations that hold the arrays decide that), so a
# repeated call skips DLPack's export, which costs ~0.25 ms per tensor under emulation
_SEEN: dict[int, tuple[weakref.ref[Any], tuple[Any, ...], weakref.ref[np.ndarray]]] = {}


def _forget(key: int) -> Any:
    """What a tensor's death does to the cache: its entry goes (before any other object can
    take its id)."""
    return lambda _: _SEEN.pop(key, None)


def _layout_of(obj: Any) -> tuple[Any, ...] | None:
    """Where a tensor's memory is, how it is laid out and whether it needs a gradient (then
    it is refused, as a fresh one is), from torch's cheap accessors as they come (torch.Size
    is a tuple, a torch.dtype compares as itself: converting them cost ~1 us more); None for
    other DLPack exporters (converted every call)."""
    try:
        return (obj.data_ptr(), obj.shape, obj.stride(), obj.dtype,
                getattr(obj, "requires_grad", False))
    except Exception:  # not a torch tensor
        return None


def kept_for(obj: Any, arr: Any) -> bool:
    """Whether arr is the array host_array keeps for obj: made of it as it is now (its
    memory, dtype, shape, strides and needing no gradient, _layout_of) and handed out again
    only while obj stays so - arr's identity stands for all that (a plan's key)."""
    seen = _SEEN.get(id(obj))
    return seen is not None and seen[2]() is arr


def _import(obj: Any, what: str) -> np.ndarray:
    try:
        device = obj.__dlpack_device__()[0] if hasattr(obj, "__dlpack_device__") else DLPACK_CPU
        if device not in (DLPACK_CPU, DLPACK_CUDA_HOST):
            raise BufferError(f"its memory is on a device (DLPack device type {device}), "
                              "not in host memory")
        arr = np.from_dlpack(obj)
    except (BufferError, RuntimeError, TypeError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"{what} ({type(obj).__name__}) cannot be used in place: {first}",
                          hint="pass a CPU tensor that needs no gradient (tensor.detach(), "
                               "tensor.cpu()), or a numpy array") from None
    return np.asarray(_Holding(arr, _storage_of(obj), obj))


def _storage_of(obj: Any) -> Any:
    """The tensor's storage: what owns its memory. DLPack's export holds the tensor, and
    `tensor.data = other` gives that tensor other memory, freeing the old while a
    registration may still point there; holding the storage keeps it alive instead - unless
    the storage itself is resized (FSDP frees memory with `storage().resize_(0)`): that,
    moved() sees."""
    for name in ("untyped_storage", "storage"):  # torch >= 2.0, then 1.13
        method = getattr(obj, name, None)
        if callable(method):
            try:
                return method()
            except Exception:  # not a torch tensor after all: DLPack alone holds the memory
                return None
    return None


class _Holding:
    """A DLPack export's memory as an array, what must live as long as any view of it does,
    and a weak reference to the caller's object (a registration of it lasts while that
    lives). numpy marks an import read-only whenever the export cannot say (DLPack before
    1.0, which torch 1.13 speaks): a tensor's memory - an object with a storage - is made
    writable again, the tensor's to write as tensor.numpy() lets it be; anything else keeps
    numpy's word."""

    def __init__(self, arr: np.ndarray, storage: Any, caller: Any) -> None:
        interface = dict(arr.__array_interface__)
        if not arr.flags.writeable and storage is not None:
            interface["data"] = (interface["data"][0], False)
        self.__array_interface__ = interface
        self.keep = (arr, storage)
        self.memory = _storage_memory(storage)
        try:
            self.caller: Any = weakref.ref(caller)
        except TypeError:  # not weakly referable: judged by our own references alone
            self.caller = None

    def moved(self) -> bool:
        """The storage's memory is not where it was (resized, freed): what was registered
        there is stale."""
        return self.memory is not None and _storage_memory(self.keep[1]) != self.memory


def _storage_memory(storage: Any) -> tuple[int, int] | None:
    try:
        return int(storage.data_ptr()), int(storage.nbytes())
    except Exception:  # no storage, or not one that says where its memory is
        return None


def holding(obj: Any) -> _Holding | None:
    """The _Holding under an array host_array made (through any views of it), else None."""
    while isinstance(obj, np.ndarray):
        obj = obj.base
    return obj if isinstance(obj, _Holding) else None


class Placement:
    """Where an object's memory was when something was made of it (a registration), to tell
    later whether it still is: a numpy array can be given other memory or another length
    under the same object (`a.resize(n, refcheck=False)`, of it or of the array it views),
    freeing the old, which a new array may then take at the same address; a tensor's storage
    can be resized or freed (_Holding.moved). Holds nothing of obj: what it was made of is
    counted by who refers to it (registrations the application dropped are let go); but the
    array it views, whose fields the pointer reads, is held (a view's base can be cleared,
    `__setstate__`, and the pointer would read freed memory)."""

    __slots__ = ("held", "pointer", "at", "root")

    def __init__(self, obj: Any) -> None:
        self.held = holding(obj)
        root = _memory_root(obj)
        self.root = root if root is not obj else None
        self.pointer = None if root is None else data_pointer(root)
        self.at = self._where(obj)

    def _where(self, obj: Any) -> tuple[int | None, int] | None:
        root = _memory_root(obj)
        return None if root is None or self.pointer is None else (self.pointer.value, root.nbytes)

    def moved(self, obj: Any) -> bool:
        """Whether obj's memory is not where, or not as long as, it was."""
        return (self.held is not None and self.held.moved()) or self._where(obj) != self.at


def _memory_root(obj: Any) -> np.ndarray | None:
    """The numpy array whose memory obj's is (obj itself, or the array it views), else None:
    the one that can be given other memory."""
    if not isinstance(obj, np.ndarray):
        return None
    while isinstance(obj.base, np.ndarray):
        obj = obj.base
    return obj


def as_buffer(obj: Any, what: str, *, writable: bool = False) -> Buffer:
    """numpy arrays, torch CPU tensors (host_array), bytearray, bytes (read-only),
    memoryview and anything with the buffer protocol; raises ConfigError naming `what` for
    anything else."""
    obj = host_array(obj, what)
    if isinstance(obj, np.ndarray):
        arr = obj
    else:
        try:
            view = memoryview(obj)
        except TypeError:
            raise ConfigError(f"{what} must be a numpy array, torch tensor, bytearray or "
                              f"memoryview, not {type(obj).__name__}") from None
        if not view.c_contiguous:
            raise ConfigError(f"{what} is not contiguous", hint="pass a contiguous copy")
        # frombuffer keeps read-only buffers (bytes) read-only
        arr = np.frombuffer(view, dtype=np.uint8) if view.nbytes else np.zeros(0, np.uint8)
    if not arr.flags.c_contiguous:
        raise ConfigError(f"{what} is not contiguous", hint="pass numpy.ascontiguousarray(x)")
    if arr.dtype.hasobject:
        raise ConfigError(f"{what} holds Python objects ({arr.dtype}): only their addresses "
                          f"would travel", hint="use a numeric dtype")
    if writable and not arr.flags.writeable:
        raise ConfigError(f"{what} is read-only; data cannot be received into it")
    dtype = str(obj.dtype) if isinstance(obj, np.ndarray) else "uint8"
    return Buffer(obj, int(arr.ctypes.data) if arr.nbytes else 0, int(arr.nbytes),
                  int(arr.itemsize) if isinstance(obj, np.ndarray) else 1, dtype,
                  bool(arr.flags.writeable))


def overlap(a: int, a_bytes: int, b: int, b_bytes: int) -> bool:
    """Whether two address ranges share a byte (an empty one shares none)."""
    return bool(a_bytes and b_bytes and a < b + b_bytes and b < a + a_bytes)


def check_pair(send: Buffer, recv: Buffer, send_bytes: int, recv_bytes: int,
               in_place: bool = False) -> None:
    if isinstance(send.owner, np.ndarray) and isinstance(recv.owner, np.ndarray) \
            and send.dtype != recv.dtype:
        raise ConfigError(f"send buffer is {send.dtype} but receive buffer is {recv.dtype}")
    if not in_place and overlap(send.address, send.nbytes, recv.address, recv.nbytes):
        raise ConfigError("the send and receive buffers overlap: peers would write into data "
                          "not yet sent", hint="pass separate buffers (in place is not supported)")
    if send.nbytes != send_bytes:
        raise ConfigError(f"send buffer has {send.nbytes} bytes, the call needs {send_bytes}")
    if recv.nbytes != recv_bytes:
        raise ConfigError(f"receive buffer has {recv.nbytes} bytes, the call needs {recv_bytes}")


def split_even(nbytes: int, parts: int, itemsize: int, what: str) -> int:
    """Bytes per rank for a buffer of nbytes split over `parts` ranks, whole elements each."""
    if nbytes % parts or (nbytes // parts) % itemsize:
        raise ConfigError(f"{what} has {nbytes} bytes, which do not split into {parts} equal "
                          f"blocks of whole elements", hint=f"use a size divisible by {parts}")
    return nbytes // parts
