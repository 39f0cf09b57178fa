"""Compression of rendezvous blocks (rxelab.codecs) on the in-memory fabric: every collective
and algorithm with each lossless codec arrives byte for byte at world sizes up to 8; the
lossy ones stay within their documented bound and every rank ends with the same bits; ranks
that disagree, codecs used where they cannot keep their promise, and malformed coded blocks
are refused with words, never a hang."""

from __future__ import annotations

import numpy as np
import pytest
import rxelab
from rxelab import codecs, ops
from rxelab.errors import ConfigError, PeerError, ProtocolError

from tests.unit.fakejob import SOCKETS, over, run_ranks

RENDEZVOUS = {"eager_limit": 1024, "chunk": 1024, "window": 4096}  # blocks > 1 KiB are coded
LOSSLESS = ("lz4", "zstd")
LOSSY = ("fp16", "bf16")


def every_collective(codec: str, count: int, pattern: str):
    """Each collective, each algorithm, on `pattern` data: wrong elements per case."""
    def job(comm):
        out = {}
        for name, c in ops.COLLECTIVES.items():
            dtype = "float32" if c.reduces else "uint8"
            for algo in c.algorithms:
                for salt in (0, 1):  # twice: the second call reuses the plan and staging
                    send, want = c.data(comm.rank, comm.size, count, dtype, salt, "sum", pattern)
                    recv = np.zeros_like(want)
                    ops.run(comm, name, algo, send, recv, compression=codec)
                    got = c.result(send, recv)
                    out[f"{name}/{algo}/{salt}"] = int(np.count_nonzero(got != want))
        return out
    return job


@pytest.mark.parametrize("codec", LOSSLESS)
@pytest.mark.parametrize("p", [1, 2, 3, *(pytest.param(p, marks=pytest.mark.slow) for p in (5, 8))])
def test_lossless_codecs_deliver_every_byte_of_every_collective(codec, p):
    for pattern in ("sparse", "random"):  # coded, and stored (random does not shrink)
        for result in run_ranks(p, every_collective(codec, 3001, pattern), seed=p, **RENDEZVOUS):
            assert set(result.values()) == {0}, (pattern, result)


def test_coded_blocks_put_fewer_bytes_on_the_wire_and_count_them():
    def job(comm):
        x = np.zeros(1 << 16, np.float32)
        y = np.zeros_like(x)
        plain = comm.allreduce(x, y, compression="none")
        coded = comm.allreduce(x, y, compression="zstd")
        return plain, coded
    for plain, coded in run_ranks(3, job, **RENDEZVOUS):
        assert plain.coded_raw == plain.coded_wire == 0 and plain.codec_seconds == 0
        assert coded.coded_raw == plain.bytes_sent  # every block went through the codec
        assert coded.coded_raw / coded.coded_wire > 50  # zeros shrink to almost nothing
        assert coded.bytes_sent < plain.bytes_sent / 20
        assert coded.codec_seconds > 0


@pytest.mark.parametrize("codec", [*LOSSLESS, "bf16"])
@over(SOCKETS)
def test_over_sockets_coded_blocks_arrive_as_over_verbs(codec, transport):
    if codec == "bf16":  # a lossy sum: every rank the same bits, within its bound
        def job(comm):
            x = np.linspace(-3, 3, 4099, dtype=np.float32) * (comm.rank + 1)
            y = np.zeros_like(x)
            comm.allreduce(x, y, compression=codec)
            return y
        out = run_ranks(3, job, transport=transport, **RENDEZVOUS)
        exact = np.linspace(-3, 3, 4099, dtype=np.float64) * 6
        assert all(np.array_equal(o, out[0]) for o in out) and np.abs(out[0] - exact).max() < 0.2
        return
    for pattern in ("sparse", "random"):
        for result in run_ranks(3, every_collective(codec, 3001, pattern), transport=transport,
                                **RENDEZVOUS):
            assert set(result.values()) == {0}, (pattern, result)


@pytest.mark.parametrize("codec", LOSSY)
@pytest.mark.parametrize("algorithm", ["ring", "recursive-doubling"])
@pytest.mark.parametrize("p", [2, 3, 5, 8])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_lossy_sums_stay_within_the_bound_and_agree_on_every_rank(codec, algorithm, p, dtype):
    n = 4099
    rng = np.random.default_rng(p)
    parts = [(rng.standard_normal(n) * 10.0 ** rng.integers(-3, 3, n)).astype(dtype)
             for _ in range(p)]
    exact = np.sum([x.astype(np.float64) for x in parts], axis=0)

    def job(comm):
        send = parts[comm.rank].copy()
        recv = np.zeros_like(send)
        comm.allreduce(send, recv, algorithm=algorithm, compression=codec)
        assert np.array_equal(send, parts[comm.rank])  # the caller's send buffer is untouched
        return recv

    results = run_ranks(p, job, seed=p, **RENDEZVOUS)
    bound = codecs.error_bound(codecs.CODECS[codec], parts)
    error = np.abs(results[0].astype(np.float64) - exact)
    assert (error <= bound).all(), float((error / bound).max())
    assert error.max() > 0  # it did round: the check above has something to check
    for other in results[1:]:
        assert np.array_equal(other, results[0])  # every rank the same bits


@pytest.mark.parametrize("codec", LOSSY)
def test_lossy_reduce_scatter_stays_within_the_bound(codec):
    p, n = 4, 2000
    inputs = [ops.contribution(r, p * n, "float32", 3, "random") for r in range(p)]

    def job(comm):
        recv = np.zeros(n, np.float32)
        comm.reduce_scatter(inputs[comm.rank].copy(), recv, compression=codec)
        return recv

    for r, got in enumerate(run_ranks(p, job, **RENDEZVOUS)):
        mine = [x[r * n:(r + 1) * n] for x in inputs]
        exact = np.sum([x.astype(np.float64) for x in mine], axis=0)
        assert (np.abs(got - exact) <= codecs.error_bound(codecs.CODECS[codec], mine)).all()


def test_values_beyond_float16_go_exactly_instead():
    def job(comm):
        x = np.full(4096, 1e6 * (comm.rank + 1), np.float32)
        y = np.zeros_like(x)
        comm.allreduce(x, y, compression="fp16")
        return y
    for y in run_ranks(3, job, **RENDEZVOUS):
        assert (y == 6e6).all()


def test_the_communicators_codec_is_the_default_and_a_call_overrides_it():
    def job(comm):
        x = np.zeros(1 << 14, np.uint8)
        y = np.zeros(3 << 14, np.uint8)
        by_default = comm.allgather(x, y)
        overridden = comm.allgather(x, y, compression="none")
        return by_default.coded_raw, overridden.coded_raw
    for default, overridden in run_ranks(3, job, compression="lz4", **RENDEZVOUS):
        assert default > 0 and overridden == 0


def test_ranks_that_disagree_on_the_codec_fail_naming_it():
    def job(comm):
        x = np.arange(1 << 14, dtype=np.uint8)
        y = np.zeros(3 << 14, np.uint8)
        with pytest.raises((ConfigError, PeerError)) as err:
            comm.allgather(x, y, algorithm="ring", compression="zstd" if comm.rank == 0 else None)
        return str(err.value)
    said = run_ranks(3, job, keep_errors=True, timeout=5, **RENDEZVOUS)
    assert any("coded with zstd" in s and "as they are" in s for s in said), said
    assert all("compression" in s or "disagree" in s or "stopped" in s for s in said), said


@pytest.mark.parametrize("call, problem", [
    (lambda comm, x: comm.alltoall(x, np.zeros_like(x), compression="bf16"), "not alltoall"),
    (lambda comm, x: comm.allreduce(x, np.zeros_like(x), op="max", compression="fp16"),
     "with op=max"),
    (lambda comm, x: comm.allreduce(x.astype(np.int32), np.zeros(x.size, np.int32),
                                    compression="bf16"), "of int32"),
    (lambda comm, x: comm.allreduce(x, np.zeros_like(x), compression="gzip"), "not a codec"),
    (lambda comm, x: comm.allreduce(x, np.zeros_like(x), compression=["zstd"]), "not a codec"),
])
def test_a_codec_that_cannot_keep_its_promise_is_refused_before_anything_is_posted(call, problem):
    def job(comm):
        x = np.ones(3 * 4096, np.float32)
        with pytest.raises(ConfigError, match=problem):
            call(comm, x)
        y = np.zeros_like(x)
        comm.allreduce(x, y)  # nothing was posted: the communicator goes on
        return float(y[0])
    assert run_ranks(2, job, **RENDEZVOUS) == [2.0, 2.0]


def test_init_refuses_an_unknown_codec_and_says_which_exist():
    with pytest.raises(ConfigError, match="use one of none, lz4, zstd, fp16, bf16"):
        rxelab.init(0, 1, "127.0.0.1", 1, compression="brotli")


def test_a_missing_codec_module_says_what_to_install(monkeypatch):
    monkeypatch.delitem(codecs._MODULES, "zstandard", raising=False)
    monkeypatch.setattr(codecs.importlib, "import_module",
                        lambda name: (_ for _ in ()).throw(ImportError(name)))
    with pytest.raises(ConfigError, match="install python3-zstandard"):
        codecs.lookup("zstd")


def test_staging_areas_are_registered_once_for_a_loop():
    def job(comm):
        x = np.arange(1 << 16, dtype=np.float32)
        y = np.zeros_like(x)
        comm.allreduce(x, y, compression="lz4")
        first = comm.registry.registrations
        for _ in range(5):
            comm.allreduce(x, y, compression="lz4")
        return comm.registry.registrations - first
    assert run_ranks(3, job, **RENDEZVOUS) == [0, 0, 0]


# ---- what a peer wrote is checked before it is decoded -----------------------------------

def a_codec(name: str) -> codecs.Codec:
    codec = codecs.lookup(name)
    assert codec is not None, name
    return codec


def coded(codec: str, data: np.ndarray) -> np.ndarray:
    area = np.zeros(codecs.HEADER.size + data.nbytes, np.uint8)
    codecs.encode(a_codec(codec), data.ctypes.data, data.nbytes, str(data.dtype), area, False)
    return area


def decode(codec: str, area: np.ndarray, length: int, dtype: str = "uint8") -> np.ndarray:
    out = np.zeros(length, np.uint8)
    codecs.decode(a_codec(codec), area, out.ctypes.data, length, dtype, peer=4)
    return out


@pytest.mark.parametrize("codec", ["lz4", "zstd", "fp16", "bf16"])
def test_a_block_survives_coding(codec):
    data = np.repeat(np.arange(256, dtype=np.float32), 16)
    assert np.array_equal(decode(codec, coded(codec, data), data.nbytes, "float32"),
                          data.view(np.uint8))  # small whole numbers: even lossy is exact


@pytest.mark.parametrize("codec", LOSSLESS)
@pytest.mark.parametrize("damage, problem", [
    (lambda a: a.__setitem__(0, 9), "malformed"),  # another codec's id
    (lambda a: a.__setitem__(1, 7), "malformed"),  # no such form
    (lambda a: a.__setitem__(slice(8, 16), np.frombuffer((999).to_bytes(8, "big"), np.uint8)),
     "malformed"),  # raw length not the block's
    (lambda a: a.__setitem__(slice(16, 24), np.frombuffer((1 << 40).to_bytes(8, "big"), np.uint8)),
     "malformed"),  # more coded bytes than the area holds
    (lambda a: a.__setitem__(slice(24, 40), 0xAB), "does not decode|decodes to"),  # garbage
])
def test_a_malformed_coded_block_is_a_protocol_error_naming_the_peer(codec, damage, problem):
    data = np.zeros(4096, np.uint8)
    area = coded(codec, data)
    damage(area)
    with pytest.raises(ProtocolError, match=problem) as err:
        decode(codec, area, data.nbytes)
    assert "rank 4" in str(err.value)


def test_random_bytes_go_stored_and_arrive_as_they_were():
    data = np.random.default_rng(0).integers(0, 256, 8192).astype(np.uint8)
    area = coded("lz4", data)
    assert codecs.HEADER.unpack_from(area.data, 0)[1] == codecs.STORED
    assert np.array_equal(decode("lz4", area, data.nbytes), data)


def test_the_benchmark_measures_coded_calls_and_verifies_them():
    from rxelab import bench

    def job(comm):
        return [bench.measure(comm, "allreduce", "ring", 1 << 16, 2, 1, codec)["wrong"]
                for codec in (None, "zstd", "bf16")] + \
            [bench.measure(comm, "reduce_scatter", "ring", 1 << 14, 2, 1, "fp16")["wrong"]]
    assert run_ranks(3, job, **RENDEZVOUS)[0] == [0, 0, 0, 0]


# ---- what a second reader found -----------------------------------------------------------

def test_ranks_that_disagree_on_the_communicators_codec_fail_in_init_naming_it():
    said = run_ranks(3, lambda comm: "started", keep_errors=True, timeout=5,
                     per_rank=lambda r: {"compression": "lz4" if r == 2 else "zstd"})
    assert all(isinstance(s, ConfigError | PeerError) for s in said), said
    assert all("rank 2 has compression=lz4, rank 0 has compression=zstd" in str(s) for s in said)


def test_a_communicators_lossy_codec_codes_its_float_sums_and_nothing_else():
    def job(comm):
        x = np.arange(3 << 12, dtype=np.float32)
        y = np.zeros_like(x)
        moved = comm.alltoall(x, y)  # floats, but no sum: as they are
        ok = np.array_equal(y.reshape(3, -1)[comm.rank], x.reshape(3, -1)[comm.rank])
        v = comm.alltoallv(x, [4096] * 3, y, [4096] * 3)
        summed = comm.allreduce(x, y)
        with pytest.raises(ConfigError, match="not alltoallv"):
            comm.alltoallv(x, [4096] * 3, y, [4096] * 3, compression="bf16")
        return moved.coded_raw, v.coded_raw, summed.coded_raw > 0, ok
    for moved, v, summed, ok in run_ranks(3, job, compression="bf16", **RENDEZVOUS):
        assert (moved, v, summed, ok) == (0, 0, True, True)


def test_a_lossy_codec_is_refused_where_its_bound_would_mean_nothing():
    with pytest.raises(ConfigError, match="bf16 serves up to 126 ranks"):
        codecs.check_use(codecs.CODECS["bf16"], "allreduce", True, "sum", "float32", 200)
    codecs.check_use(codecs.CODECS["bf16"], "allreduce", True, "sum", "float32", 126)
    codecs.check_use(codecs.CODECS["fp16"], "allreduce", True, "sum", "float32", 1022)


@pytest.mark.parametrize("bits", [0xFFFFFFFF, 0x7FFFFFFF, 0x7FFF8000, 0x7F800001, 0xFF800000])
def test_bf16_keeps_nans_and_infinities_whatever_their_bits(bits):
    x = np.full(2048, bits, np.uint32).view(np.float32)
    got = decode("bf16", coded("bf16", x), x.nbytes, "float32").view(np.float32)
    assert np.array_equal(np.isnan(got), np.isnan(x)) and np.array_equal(np.isinf(got), np.isinf(x))
    assert np.array_equal(np.signbit(got), np.signbit(x))


def test_bf16_underflow_stays_within_the_bound():
    parts = [np.full(2048, 2.0 ** -149, np.float32), np.full(2048, -2.0 ** -140, np.float32)]
    got = [decode("bf16", coded("bf16", x), x.nbytes, "float32").view(np.float32) for x in parts]
    error = np.abs(got[0].astype(np.float64) + got[1] - (parts[0].astype(np.float64) + parts[1]))
    assert (error <= codecs.error_bound(codecs.CODECS["bf16"], parts)).all()


def test_a_zstd_frame_may_not_choose_how_much_the_receiver_allocates():
    import zstandard
    huge = zstandard.ZstdCompressor().compress(bytes(1 << 20))  # declares 1 MiB
    area = coded("zstd", np.zeros(4096, np.uint8))
    codecs.HEADER.pack_into(area.data, 0, 2, codecs.CODED, 0, 4096, len(huge))
    area = np.concatenate([area[:codecs.HEADER.size], np.frombuffer(huge, np.uint8)])
    with pytest.raises(ProtocolError, match="declares 1048576 bytes, expected 4096"):
        decode("zstd", area, 4096)


@pytest.mark.parametrize("algorithm", ["star", "binomial"])
def test_a_broadcast_codes_its_block_once_for_every_peer(algorithm):
    from rxelab.collectives.common import SENDING

    def job(comm):
        x = np.arange(1 << 15, dtype=np.uint8) if comm.rank == 0 else np.zeros(1 << 15, np.uint8)
        comm.bcast(x, algorithm=algorithm, compression="zstd")
        staging = list(comm.plans.values())[-1].staging
        return staging.used[SENDING], bool((x == np.arange(1 << 15, dtype=np.uint8)).all())
    out = run_ranks(5, job, **RENDEZVOUS)
    assert all(ok for _, ok in out) and out[0][0] == 1  # root: one area for its 4 (or 2) peers
