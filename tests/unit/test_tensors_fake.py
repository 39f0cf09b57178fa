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
        out = FakeTensor(np.zeros(1000, np.float32))
        comm.allreduce(grad, out)
        first = out.data.copy()
        comm.allreduce(grad, grad)  # in place, on the tensor's own memory
        in_place = grad.data.copy()
        out.data = np.zeros(1000, np.float32)  # the same object, other memory: a new plan
        comm.allreduce(FakeTensor(np.full(1000, 2.0, np.float32)), out)
        block = FakeTensor(np.full(16, comm.rank, np.uint8))
        gathered = FakeTensor(np.zeros(16 * comm.size, np.uint8))
        comm.allgather(block, gathered)
        return first, in_place, out.data.copy(), gathered.data.copy()

    total = p * (p + 1) / 2
    for first, in_place, after, gathered in run_ranks(p, job):
        assert (first == total).all() and (in_place == total).all()
        assert (after == 2.0 * p).all(), "the result landed in the tensor's new memory"
        assert (gathered == np.repeat(np.arange(p, dtype=np.uint8), 16)).all()


class DeviceTensor(FakeTensor):
    def __dlpack_device__(self):
        return (2, 0)  # kDLCUDA: memory the host cannot register


def test_a_tensor_not_on_the_cpu_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"^receive buffer \(DeviceTensor\) cannot be used in "
                                          r"place: its memory is on a device"):
        as_buffer(DeviceTensor(np.zeros(2, np.float32)), "receive buffer", writable=True)
