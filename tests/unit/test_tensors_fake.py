"""rxelab takes torch CPU tensors wherever it takes numpy arrays, in place (issue 19). No torch
on the host: FakeTensor exports its memory as a torch tensor does (DLPack, a storage() that owns
the memory, `.data =` that gives the same object other memory, refusal for tensors that need a
gradient); the lab's e2e test runs the real torch."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
from rxelab.buffers import as_buffer, host_array
from rxelab.comm import MAX_PLANS
from rxelab.errors import ConfigError

from tests.unit.fakejob import run_ranks


class Storage:
    def __init__(self, arr: np.ndarray) -> None:
        self.arr = arr


class FakeTensor:
    def __init__(self, arr: np.ndarray, requires_grad: bool = False) -> None:
        self._storage = Storage(arr)
        self.requires_grad = requires_grad

    def __dlpack__(self, stream=None):
        if self.requires_grad:
            raise RuntimeError("Can't export tensors that require gradient, use tensor.detach()")
        return self._storage.arr.__dlpack__()

    def __dlpack_device__(self):
        return self._storage.arr.__dlpack_device__()

    def storage(self) -> Storage:
        return self._storage

    # torch's cheap accessors, by which the library knows a tensor it has seen as it was
    def data_ptr(self) -> int:
        return int(self._storage.arr.ctypes.data)

    @property
    def shape(self) -> tuple[int, ...]:
        return self._storage.arr.shape

    def stride(self) -> tuple[int, ...]:
        return tuple(s // self._storage.arr.itemsize for s in self._storage.arr.strides)

    @property
    def dtype(self) -> str:
        return str(self._storage.arr.dtype)

    @property
    def data(self) -> np.ndarray:
        return self._storage.arr

    @data.setter
    def data(self, arr: np.ndarray) -> None:  # torch's `tensor.data = other`: new memory
        self._storage = Storage(arr)


def test_a_tensor_is_seen_in_place_writable_with_its_dtype():
    t = FakeTensor(np.zeros(4, np.float32))
    a = host_array(t, "receive buffer")
    a[1] = 7
    assert t.data[1] == 7 and a.flags.writeable, "numpy < 2.1 marks DLPack imports read-only"
    b = as_buffer(t, "receive buffer", writable=True)
    assert (b.dtype, b.nbytes, b.address) == ("float32", 16, t.data.ctypes.data)


def test_the_tensors_memory_lives_as_long_as_the_librarys_view_of_it():
    t = FakeTensor(np.zeros(1024, np.float32))
    a = host_array(t, "send buffer")
    gone = weakref.ref(t.storage())
    t.data = np.ones(1024, np.float32)  # the tensor lets go of its old memory
    gc.collect()
    assert gone() is not None, "held by the view: no registration can point into freed memory"
    del a
    gc.collect()
    assert gone() is None, "and let go with it"


def test_a_tensor_that_needs_a_gradient_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"^send buffer \(FakeTensor\) cannot be used in place: "
                                          r"Can't export tensors that require gradient") as e:
        as_buffer(FakeTensor(np.zeros(2, np.float32), requires_grad=True), "send buffer")
    assert "tensor.detach()" in e.value.hint


def test_other_objects_are_left_as_they_are():
    arr, raw = np.zeros(2), bytearray(4)
    assert host_array(arr, "x") is arr and host_array(raw, "x") is raw


@pytest.mark.parametrize("p", [2, 3, 5])
def test_collectives_run_on_tensors_in_place_and_follow_a_tensor_given_new_memory(p):
    def job(comm):
        grad = FakeTensor(np.full(1000, comm.rank + 1, np.float32))
        twos = FakeTensor(np.full(1000, 2, np.float32))
        out = FakeTensor(np.zeros(1000, np.float32))
        comm.allreduce(twos, out)
        first = out.data.copy()
        comm.allreduce(grad, grad)  # in place, on the tensor's own memory
        in_place = grad.data.copy()
        out.data = np.zeros(1000, np.float32)  # the same objects as the first call, new memory
        comm.allreduce(twos, out)
        moved = out.data.copy()
        # the same memory seen as another dtype: a plan of its own, never the float32 one
        twos.data, out.data = twos.data.view(np.int32), out.data.view(np.int32)
        twos.data[:] = 10**8 * (comm.rank + 1)  # summed as float32 bits, these would not add up
        comm.allreduce(twos, out)
        block = FakeTensor(np.full(16, comm.rank, np.uint8))
        gathered = FakeTensor(np.zeros(16 * comm.size, np.uint8))
        comm.allgather(block, gathered)
        return first, in_place, moved, out.data.copy(), gathered.data.copy()

    total = p * (p + 1) / 2
    for first, in_place, moved, as_int, gathered in run_ranks(p, job):
        assert (first == 2.0 * p).all() and (in_place == total).all()
        assert (moved == 2.0 * p).all(), "the result landed in the tensor's new memory"
        assert as_int.dtype == np.int32 and (as_int == 10**8 * p * (p + 1) // 2).all(), \
            "summed as int32"
        assert (gathered == np.repeat(np.arange(p, dtype=np.uint8), 16)).all()


def test_a_loop_on_the_same_tensors_keeps_one_plan_and_one_registration_each():
    def job(comm):
        grad = FakeTensor(np.ones(4096, np.float32))
        out = FakeTensor(np.zeros(4096, np.float32))
        block, gathered = FakeTensor(np.ones(64, np.uint8)), FakeTensor(np.zeros(64 * comm.size, np.uint8))
        counts = []
        for _ in range(10):  # a step's collectives, one after another: each plan is kept
            comm.allreduce(grad, out)
            comm.allgather(block, gathered)
            comm.bcast(grad)
            counts.append((len(comm.plans), comm.registry.registrations))
        for _ in range(20):  # fresh tensors every call, dropped after it: the plans stay bounded
            comm.allreduce(FakeTensor(np.ones(4096, np.float32)), FakeTensor(np.zeros(4096, np.float32)))
        return counts, len(comm.plans)

    for counts, after in run_ranks(2, job):
        assert counts[-1] == counts[1], f"plans and registrations grew with the calls: {counts}"
        assert counts[-1][0] == 3, f"each collective's plan is kept while its tensors live: {counts}"
        assert after <= MAX_PLANS, f"{after} plans kept for tensors the application dropped"


class Resizable(Storage):
    """A storage that can be given other memory in place (torch's storage().resize_())."""

    def data_ptr(self) -> int:
        return int(self.arr.ctypes.data)

    def nbytes(self) -> int:
        return int(self.arr.nbytes)


def test_a_registration_of_a_storage_resized_since_is_made_anew():
    from rxelab.registry import Registry

    made = []

    class MR:
        def close(self) -> None:
            pass

    reg = Registry(lambda addr, n, access: made.append((addr, n)) or MR(), limit=1 << 30)
    t = FakeTensor(np.zeros(1024, np.float32))
    t._storage = Resizable(t._storage.arr)
    reg.register(as_buffer(t, "x"), 0)
    reg.end_call()
    reg.register(as_buffer(t, "x"), 0)
    assert len(made) == 1, "same memory: the registration is reused"
    keep = t._storage.arr
    t._storage.arr = np.zeros(1024, np.float32)  # the storage's memory moved under us
    reg.register(as_buffer(keep, "x"), 0)  # anything else at the old address
    assert len(made) == 2, "the stale registration is not reused"


class Export:
    """Something that exports memory by DLPack and is not a tensor (no storage): a JAX array."""

    def __init__(self, arr: np.ndarray) -> None:
        self.arr = arr

    def __dlpack__(self, **kwargs):
        return self.arr.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.arr.__dlpack_device__()


def test_an_export_that_is_not_a_tensor_keeps_numpys_read_only_word():
    ro = np.zeros(4, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ConfigError, match="read-only"):
        as_buffer(Export(ro), "receive buffer", writable=True)
    assert as_buffer(Export(ro), "send buffer").nbytes == 16, "it can still be sent"


class DeviceTensor(FakeTensor):
    def __dlpack_device__(self):
        return (2, 0)  # kDLCUDA: memory the host cannot register


def test_a_tensor_not_on_the_cpu_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"^receive buffer \(DeviceTensor\) cannot be used in "
                                          r"place: its memory is on a device"):
        as_buffer(DeviceTensor(np.zeros(2, np.float32)), "receive buffer", writable=True)


def test_a_tensor_seen_again_as_it_was_is_not_exported_again_and_the_cache_keeps_nothing_alive(
        monkeypatch):
    from rxelab import buffers

    exports = []
    real = buffers._import
    monkeypatch.setattr(buffers, "_import", lambda obj, what: exports.append(1) or real(obj, what))
    t = FakeTensor(np.zeros(64, np.float32))
    a = host_array(t, "x")
    assert host_array(t, "x") is a and len(exports) == 1, "the same tensor, as it was"
    t.data = np.zeros(64, np.float32)  # other memory
    b = host_array(t, "x")
    assert b is not a and len(exports) == 2
    t.data = t.data.view(np.int32)  # the same memory as another dtype
    c = host_array(t, "x")
    assert c is not b and c.dtype == np.int32 and len(exports) == 3
    gone = weakref.ref(c)
    del a, b, c
    gc.collect()
    assert gone() is None, "the cache holds no array"
    assert id(t) in buffers._SEEN
    key = id(t)
    del t
    gc.collect()
    assert key not in buffers._SEEN, "a dead tensor's entry goes with it"
