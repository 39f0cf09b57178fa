"""Compression of rendezvous blocks, opt in (init(compression=...) or a collective's
compression=...): fewer bytes on a slow link for CPU time spent on both ends. Under TCG the
CPU is dear, so whether it pays is measured (the `compression` spec), not assumed.

- lossless, any dtype: "lz4" (lz4's block format) and "zstd" (level 1): every byte arrives
  as it was sent.
- lossy, float32/float64 sums only: "fp16" and "bf16" put each element on the wire as a
  float16 / bfloat16, rounded to nearest. So that every rank ends with the same bits, a
  sender rounds its own copy of what it sends too (in the receive buffer or scratch, never in
  the caller's send buffer). Each rounding of a partial sum errs by at most u times its
  magnitude (u = 2^-11 for fp16, 2^-8 for bf16) plus, for fp16, 2^-25 where it underflows;
  an element of the result takes at most p such roundings (the ring: p-1 partial sums and the
  final one; recursive doubling: log2(p) + 2), so with p ranks and k = p + 1
      |result - exact sum| <= gamma * sum_i |x_i| + k * eta,  gamma = k u / (1 - k u)
  (error_bound(); the errors compound, k u is the first-order term; the extra rounding covers
  float arithmetic) with eta = 2^-25 for fp16 and 2^-134 for bf16, half their smallest step.
  A lossy codec serves while k u < 1/2: bf16 up to 126 ranks, fp16 up to 1022. Given to a
  communicator, a lossy codec codes its float sums; its other collectives go as they are.
  A block that float16 cannot hold (a finite value beyond 65504) goes as it is, exactly.

On the wire a coded block is a header (codec, form, raw and coded lengths) and its payload,
written into a staging area the receiver advertised (ready-to-receive names the codec, so two
ranks that disagree fail at once, naming it). A block that does not shrink goes stored (as
it is, after the header): the receiver's room is never more than the block and the header.
What a peer wrote is checked before it is decoded: the codec it advertised, the lengths it
must have, a stream that decodes to exactly the block.
"""

from __future__ import annotations

import ctypes
import importlib
import mmap
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from rxelab.buffers import MIN_AREA
from rxelab.errors import ConfigError, ProtocolError

HEADER = struct.Struct("!BBH4xQQ")  # codec id, form, reserved, raw bytes, payload bytes
CODED, STORED = 0, 1
NONE = "none"


@dataclass(frozen=True)
class Codec:
    name: str
    id: int  # travels in ready-to-receive: 0 is "not coded"
    lossy: bool
    module: str | None = None  # the Python module it needs (Debian's package says the hint)
    package: str | None = None
    unit: float = 0.0  # lossy: the unit roundoff u of the wire format
    eta: float = 0.0  # lossy: the absolute error where it underflows

    def room(self, length: int) -> int:
        """Bytes the receiver advertises for a block of `length` bytes."""
        return HEADER.size + length


CODECS: dict[str, Codec] = {c.name: c for c in (
    Codec("lz4", 1, False, "lz4.block", "python3-lz4 (pip: lz4)"),
    Codec("zstd", 2, False, "zstandard", "python3-zstandard (pip: zstandard)"),
    Codec("fp16", 3, True, unit=2.0 ** -11, eta=2.0 ** -25),
    Codec("bf16", 4, True, unit=2.0 ** -8, eta=2.0 ** -134),
)}
BY_ID = {c.id: c for c in CODECS.values()}
NAMES_BY_ID = {0: NONE, **{c.id: c.name for c in CODECS.values()}}
MAX_GROWTH = 0.5  # a lossy codec's (p + 1) u must stay below this: its bound means something
NAMES = (NONE, *CODECS)
LOSSY_DTYPES = ("float32", "float64")
ZSTD_LEVEL = 1  # the fastest of zstd's usual levels: the CPU is the scarce thing here
_MODULES: dict[str, Any] = {}
_PER_THREAD = threading.local()


def staging_bound(codec: Codec | None, layout: Any, p: int, algorithm: str) -> int:
    """Bytes a call coded with `codec` may pin in staging areas beside its buffers, both
    directions, at most: each area holds a block and its header, is at least 4 KiB, and is
    pinned in whole pages (counted before anything is posted, against pin_limit)."""
    if codec is None:
        return 0
    blocks, nbytes = layout.moves(p, algorithm)
    per_area = HEADER.size + MIN_AREA + 2 * mmap.PAGESIZE
    return 2 * (nbytes + blocks * per_area)


def lookup(name: Any, what: str = "compression") -> Codec | None:
    """The codec called `name` (None for "none" or None), its module importable, or a
    ConfigError that says what to install."""
    if name is None or name == NONE:
        return None
    if not isinstance(name, str) or name not in CODECS:
        raise ConfigError(f"{what}={name!r} is not a codec", hint=f"use one of {', '.join(NAMES)}")
    codec = CODECS[name]
    if codec.module is not None and codec.module not in _MODULES:
        try:
            _MODULES[codec.module] = importlib.import_module(codec.module)
        except ImportError:
            raise ConfigError(f"{what}={name}: Python's {codec.module} is not installed here",
                              hint=f"install {codec.package}") from None
    return codec


def id_of(codec: Codec | None) -> int:
    return 0 if codec is None else codec.id


def fits(codec: Codec | None, reduces: bool, op: str | None, dtype: str) -> bool:
    """Whether the codec can code this call: lossless ones anything, lossy ones float sums."""
    return codec is None or not codec.lossy or (reduces and op == "sum" and dtype in LOSSY_DTYPES)


def check_use(codec: Codec | None, collective: str, reduces: bool, op: str | None,
              dtype: str, ranks: int = 2) -> None:
    """A lossy codec only where its bound is promised: sums of float32/float64, over few
    enough ranks that (p + 1) u stays small."""
    if codec is None or not codec.lossy:
        return
    if (ranks + 1) * codec.unit >= MAX_GROWTH:
        most = int(MAX_GROWTH / codec.unit) - 2
        raise ConfigError(f"compression={codec.name} over {ranks} ranks: its rounding error "
                          f"would grow past any useful bound ({codec.name} serves up to {most} "
                          f"ranks)", hint="use fp16 (finer) or a lossless codec")
    if not fits(codec, reduces, op, dtype):
        from rxelab.ops import COLLECTIVES  # the descriptions say which are float sums

        sums = ", ".join(c.name for c in COLLECTIVES.values()
                         if c.reduces and c.dtype in LOSSY_DTYPES)
        what = f"{collective} of {dtype}" + (f" with op={op}" if reduces else "")
        raise ConfigError(f"compression={codec.name} rounds values: it is for sums of float32 "
                          f"or float64 ({sums}), not {what}",
                          hint="use a lossless codec (lz4, zstd) for any other data")


def error_bound(codec: Codec, parts: list[np.ndarray]) -> np.ndarray:
    """The promised bound on |result - exact sum| per element, for the ranks' inputs `parts`:
    gamma * sum_i |x_i| + k * eta, k = p + 1 roundings, gamma = k u / (1 - k u) (the
    rounding errors compound; k u is the first-order term)."""
    magnitude = np.sum([np.abs(x.astype(np.float64)) for x in parts], axis=0)
    k = len(parts) + 1
    gamma = k * codec.unit / (1 - k * codec.unit)
    return gamma * magnitude + k * codec.eta


def view(address: int, nbytes: int, dtype: str = "uint8") -> np.ndarray:
    """numpy over raw memory (a block of a registered buffer): no copy."""
    if nbytes == 0:
        return np.zeros(0, dtype)
    return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(address)).view(dtype)


# ---- encoding -----------------------------------------------------------------------------
def encode(codec: Codec, address: int, length: int, dtype: str, area: np.ndarray,
           writable: bool) -> tuple[int, float]:
    """Code the block at `address` into `area` (header + payload): (bytes to send, CPU seconds).
    A lossy codec also rounds the block in place when `writable` (so the sender keeps what the
    receiver gets); the block goes stored where coding would not shrink it or lose range."""
    t0 = time.thread_time()
    block = view(address, length)
    payload = area[HEADER.size:HEADER.size + length]
    n = _lossy(codec, block, dtype, payload, writable) if codec.lossy else _lossless(codec, block, payload)
    form = CODED
    if n is None:
        payload[:] = block
        n, form = length, STORED
    HEADER.pack_into(area.data, 0, codec.id, form, 0, length, n)
    return HEADER.size + n, time.thread_time() - t0


def settle(codec: Codec, x: np.ndarray) -> None:
    """Round a result in place to what the wire format holds (or leave it, where the format
    cannot hold it), as encode would: where an algorithm leaves ranks with a sum that was not
    sent after it was made (recursive doubling's last step), every rank rounds it the same way,
    so all end with the same bits."""
    if x.size:
        _lossy(codec, x.reshape(-1).view(np.uint8), str(x.dtype), np.empty(x.nbytes, np.uint8),
               True)


def _lossless(codec: Codec, block: np.ndarray, payload: np.ndarray) -> int | None:
    module = _MODULES[codec.module]  # type: ignore[index]
    if codec.name == "lz4":
        out = module.compress(block, mode="default", store_size=False)
    else:
        out = _zstd("compressor", lambda: module.ZstdCompressor(level=ZSTD_LEVEL)).compress(block)
    if len(out) >= block.size:
        return None
    payload[:len(out)] = np.frombuffer(out, np.uint8)
    return len(out)


def _zstd(kind: str, make: Any) -> Any:
    """A zstd (de)compressor kept for every block of this thread: making one costs more than
    a small block, and one must never serve two threads at once (communicators of one
    process on threads of their own)."""
    found = getattr(_PER_THREAD, kind, None)
    if found is None:
        found = make()
        setattr(_PER_THREAD, kind, found)
    return found


def _lossy(codec: Codec, block: np.ndarray, dtype: str, payload: np.ndarray,
           writable: bool) -> int | None:
    """Round to the wire format (and, when writable, the block in place to what the wire
    holds); None where a finite value would not survive. Few passes over the block, each in
    place: under emulation every pass costs milliseconds per MiB."""
    x = block.view(dtype)
    wire = payload[:x.size * 2].view(np.uint16)
    if codec.name == "fp16":
        half = wire.view(np.float16)
        with np.errstate(over="ignore", invalid="ignore"):
            np.copyto(half, x, casting="unsafe")
        back = half.astype(dtype)  # (numpy's float16 loops are slow: checked as float32)
        if not np.isfinite(back).all() and _lost_range(back, x):
            return None
        if writable:
            np.copyto(x, back)
        return wire.nbytes
    if dtype == "float32":
        single = x
    else:
        with np.errstate(over="ignore"):
            single = x.astype(np.float32)
    u = single.view(np.uint32)
    t = u >> 16  # round to nearest even: add 0x7FFF and the lowest kept bit, keep the top half
    t &= 1
    t += 0x7FFF
    t += u  # numpy wraps uint32, as C does
    t >>= 16
    np.copyto(wire, t, casting="unsafe")
    # an infinity or NaN in, or a value that rounds to infinity (NaNs with a high payload
    # wrap round to zero in the rounding above): look closer
    if (u & 0x7FFFFFFF).max(initial=0) >= 0x7F7F8000:
        nan = np.isnan(single)
        wire[nan] = (u[nan] >> 16) | 0x0040  # a quiet NaN with the sign it had
        if _lost_range(_from_wire(codec, wire, dtype), x):
            return None
        t = wire.astype(np.uint32)
    if writable:
        t <<= 16
        if dtype == "float32":
            np.copyto(u, t)
        else:
            np.copyto(x, t.view(np.float32))
    return wire.nbytes


def _lost_range(back: np.ndarray, x: np.ndarray) -> bool:
    """A finite value became infinite (beyond the wire format's range)."""
    return bool((np.isfinite(back) != np.isfinite(x)).any())


def _from_wire(codec: Codec, wire: np.ndarray, dtype: str) -> np.ndarray:
    if codec.name == "fp16":
        return wire.view(np.float16).astype(dtype)
    wide = (wire.astype(np.uint32) << 16).view(np.float32)
    return wide if dtype == "float32" else wide.astype(dtype)


# ---- decoding -----------------------------------------------------------------------------
def decode(codec: Codec, area: np.ndarray, address: int, length: int, dtype: str,
           peer: int) -> tuple[int, float]:
    """Check what `peer` wrote into `area` and decode it into the block at `address`:
    (bytes it wrote, CPU seconds). Anything but a well-formed block of exactly `length` bytes,
    coded as advertised, is a ProtocolError naming the peer."""
    t0 = time.thread_time()
    if area.size < HEADER.size:
        raise ProtocolError(f"coded block from rank {peer}: staging area of {area.size} bytes")
    cid, form, _, raw, n = HEADER.unpack_from(area.data, 0)
    if cid != codec.id or form not in (CODED, STORED) or raw != length or \
            n > length or (form == STORED and n != length) or HEADER.size + n > area.size:
        raise ProtocolError(f"coded block from rank {peer} is malformed (codec {cid}, form "
                            f"{form}, {raw} raw and {n} coded bytes; expected {codec.name} of "
                            f"{length} bytes)")
    payload = area[HEADER.size:HEADER.size + n]
    dest = view(address, length)
    if form == STORED:
        dest[:] = payload
    elif codec.lossy:
        x = dest.view(dtype)
        if n != x.size * 2:
            raise ProtocolError(f"coded block from rank {peer}: {n} bytes of {codec.name} for "
                                f"{x.size} {dtype} elements")
        _into(codec, payload.view(np.uint16), x)
    else:
        _inflate(codec, payload, dest, peer)
    return HEADER.size + n, time.thread_time() - t0


def _inflate(codec: Codec, payload: np.ndarray, dest: np.ndarray, peer: int) -> None:
    module = _MODULES[codec.module]  # type: ignore[index]
    try:
        if codec.name == "lz4":
            out = module.decompress(payload, uncompressed_size=dest.size)
        else:
            # the frame's header says how much it holds, and zstd allocates that before it
            # decodes: a peer must not choose our allocation
            declared = module.frame_content_size(payload)
            if declared != dest.size:
                raise ProtocolError(f"zstd block from rank {peer} declares {declared} bytes, "
                                    f"expected {dest.size}")
            # one frame, and nothing after it: the block is exactly what was coded
            out = _zstd("decompressor", module.ZstdDecompressor).decompress(
                payload, max_output_size=dest.size, allow_extra_data=False)
    except ProtocolError:
        raise
    except Exception as err:  # each library's own error type: a corrupt stream
        raise ProtocolError(f"{codec.name} block from rank {peer} does not decode: "
                            f"{str(err)[:120]}") from None
    if len(out) != dest.size:
        raise ProtocolError(f"{codec.name} block from rank {peer} decodes to {len(out)} bytes, "
                            f"expected {dest.size}")
    dest[:] = np.frombuffer(out, np.uint8)


def _into(codec: Codec, wire: np.ndarray, x: np.ndarray) -> None:
    """The wire's values into x, in one pass where numpy can (fp16 casts; bf16 shifts)."""
    if codec.name == "fp16":
        np.copyto(x, wire.view(np.float16))
    elif x.dtype == np.float32:
        wide = x.view(np.uint32)
        np.copyto(wide, wire)
        wide <<= 16
    else:
        np.copyto(x, (wire.astype(np.uint32) << 16).view(np.float32))
