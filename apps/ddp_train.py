"""DDP on rxelab beside Gloo: a small real model (an MLP of a few million parameters, on
synthetic data) trained with DistributedDataParallel, with the same seed, data and steps
under each backend, in alternated rounds (A, B, A, B, ...) in one job. It checks that every
rank ends with the same parameters and that rxelab's match Gloo's within float summation
tolerance, and reports the time per step and per gradient bucket of each, as JSON lines.

    python3 -m rxelab.launch --hosts node1,node2,node3 -- python3 apps/ddp_train.py
    torchrun --nnodes 3 --nproc_per_node 1 --node_rank I --master_addr node1 apps/ddp_train.py
    srun -N3 python3 apps/ddp_train.py

The first backend of --backends is the job's default group (dist.init_process_group); the
others are groups beside it (dist.new_group). Variants: each backend with each of DDP's own
hooks (--hooks none,fp16,bf16: torch's allreduce, fp16 and bf16 compression hooks, the same
for every backend), and with --codec rxelab's own fp16 codec on the wire (the library codes
float sums; DDP's hook stays the plain allreduce). With --wraps, the same model sharded by FSDP
or FSDP2 is a variant per backend too (apps/sharded.py), compared with Gloo's alike.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import logging
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

if TYPE_CHECKING:  # the same module as mypy reaches it from the tree (the node runs this file)
    from apps import gloo_compare, sharded
else:
    import gloo_compare
    import sharded

HOOKS = ("none", "fp16", "bf16")
CODEC = "codec-fp16"  # rxelab's fp16 codec on the wire, DDP's plain allreduce hook
# how far a variant's parameters may be from Gloo's with the same hook after the run: sums
# in another order (and, compressed, rounded at other points) differ in the last bits
TOLERANCE = {"none": (1e-4, 1e-5), "fp16": (2e-2, 2e-3), "bf16": (1e-1, 2e-2), CODEC: (2e-2, 2e-3)}
INIT_TIMEOUT_S = 120


@dataclass(frozen=True)
class Variant:
    backend: str
    hook: str  # one of HOOKS, or CODEC
    wrap: str = "ddp"  # one of sharded.WRAPS; FSDP's variants have no hook

    @property
    def name(self) -> str:
        if self.wrap != "ddp":
            return f"{self.backend}+{self.wrap}"
        return self.backend if self.hook == "none" else f"{self.backend}+{self.hook}"

    def reference(self) -> Variant:
        """What it is compared with: Gloo with the same hook and wrap; the codec, and bf16
        (torch 1.13's Gloo has no bfloat16 all_reduce), with Gloo uncompressed."""
        return Variant("gloo", "none" if self.hook in (CODEC, "bf16") else self.hook, self.wrap)


@dataclass
class Result:
    params: Any  # the flattened parameters after the run (a torch tensor)
    step_s: list[float] = field(default_factory=list)
    bucket_s: dict[int, list[float]] = field(default_factory=dict)  # bucket index -> times
    bucket_bytes: dict[int, int] = field(default_factory=dict)


def build_model(width: int, depth: int, seed: int) -> Any:
    """The MLP, its weights drawn from a generator of its own (as Linear's default, uniform
    in +-1/sqrt(fan_in)): torch's global one is shared by every thread of a process."""
    import torch

    layers: list[Any] = [torch.nn.Linear(256, width), torch.nn.ReLU()]
    for _ in range(depth - 2):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    layers.append(torch.nn.Linear(width, 16))
    model = torch.nn.Sequential(*layers)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                bound = layer.in_features ** -0.5
                layer.weight.uniform_(-bound, bound, generator=g)
                layer.bias.uniform_(-bound, bound, generator=g)
    return model


def batch(rank: int, step: int, size: int, seed: int) -> tuple[Any, Any]:
    """Each rank's own batch of a step, the same under every variant."""
    import torch

    g = torch.Generator().manual_seed(seed * 1_000_003 + rank * 10_007 + step)
    x = torch.randn(size, 256, generator=g)
    return x, torch.sin(x[:, :16] * 3) + x[:, 16:32] ** 2


def timed(hook: Any, result: Result) -> Any:
    """DDP's hook, timed per bucket from the hook's call to its future's completion. (No
    annotations: DDP accepts none but its own types, and those only torch has.)"""
    def run(state, bucket):  # type: ignore[no-untyped-def]
        started = time.perf_counter()
        result.bucket_bytes[bucket.index()] = bucket.buffer().numel() * bucket.buffer().element_size()
        fut = hook(state, bucket)

        def done(f: Any) -> Any:
            result.bucket_s.setdefault(bucket.index(), []).append(time.perf_counter() - started)
            return f.value()
        return fut.then(done)
    return run


def train(group: Any, hook: str, args: argparse.Namespace, rank: int, wrap: str = "ddp") -> Result:
    """args.steps steps of SGD on the model with DDP (or FSDP: `wrap`) over `group`; the last
    ones timed."""
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel

    model = build_model(args.width, args.depth, args.seed)
    result = Result(None)
    if wrap == "ddp":
        ddp = DistributedDataParallel(model, process_group=group, bucket_cap_mb=args.bucket_mb)
        chosen = {"fp16": default_hooks.fp16_compress_hook,
                  "bf16": default_hooks.bf16_compress_hook}.get(hook, default_hooks.allreduce_hook)
        ddp.register_comm_hook(group, timed(chosen, result))
    else:
        ddp = sharded.shard(model, group, wrap)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    for step in range(args.warmup + args.steps):
        x, y = batch(rank, step, args.batch, args.seed)
        started = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
        if step >= args.warmup:
            result.step_s.append(time.perf_counter() - started)
        else:  # the warm-up's buckets (DDP rebuilds them after the first step) are not kept
            result.bucket_s.clear()
    result.params = (torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()
                     if wrap == "ddp" else sharded.whole_parameters(model, ddp, wrap))
    return result


def first_bucket(mb: float) -> None:
    """The cap of DDP's first bucket (1 MiB of its own), which DDP reads from its module when
    a DDP is made: set for the process, before any is made."""
    import torch.distributed as dist

    dist._DEFAULT_FIRST_BUCKET_BYTES = int(mb * 2**20)


def gloo_sums_bf16(group: Any) -> bool:
    """Whether this torch's Gloo can all_reduce bfloat16 (1.13's refuses it, on every rank
    alike, before anything is sent)."""
    import torch
    import torch.distributed as dist

    try:
        dist.all_reduce(torch.ones(1, dtype=torch.bfloat16), group=group)
    except RuntimeError:
        return False
    return True


def variants(backends: list[str], hooks: list[str], codec: bool,
             gloo_bf16: bool = True, wraps: tuple[str, ...] = ()) -> list[Variant]:
    out = [Variant(b, h) for h in hooks for b in backends
           if not (b == "gloo" and h == "bf16" and not gloo_bf16)]
    if "bf16" in hooks and "rxelab" in backends and "gloo" in backends and \
            Variant("gloo", "none") not in out:
        out.append(Variant("gloo", "none"))  # bf16's reference where Gloo cannot run it
    if codec and "rxelab" in backends:
        out.append(Variant("rxelab", CODEC))
    return out + [Variant(b, "none", w) for w in wraps for b in backends]


def digest(params: Any) -> str:
    return hashlib.sha256(params.numpy().tobytes()).hexdigest()[:16]


def compare(results: dict[Variant, Result]) -> dict[Variant, dict[str, Any]]:
    """Each variant's parameters against its reference's (Gloo with the same hook)."""
    import torch

    out: dict[Variant, dict[str, Any]] = {}
    for v, res in results.items():
        ref = results.get(v.reference())
        if ref is None or v.backend == "gloo":
            out[v] = {}
            continue
        rtol, atol = TOLERANCE[v.hook]
        diff = (res.params - ref.params).abs()
        out[v] = {"reference": v.reference().name, "max_abs_diff": float(diff.max()),
                  "rtol": rtol, "atol": atol,
                  "matches": bool(torch.allclose(res.params, ref.params, rtol=rtol, atol=atol))}
    return out


def arguments() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", default="rxelab,gloo",
                    help="comma-separated; the first is the default group (default rxelab,gloo)")
    ap.add_argument("--hooks", default="none",
                    help=f"comma-separated DDP hooks, each a variant per backend: {', '.join(HOOKS)}")
    ap.add_argument("--codec", action="store_true",
                    help="one more variant: rxelab with its fp16 codec on the wire")
    ap.add_argument("--wraps", default="",
                    help="comma-separated sharded variants beside DDP's, one per backend: "
                         "fsdp (FullyShardedDataParallel), fsdp2 (fully_shard; on CPU a torch "
                         "newer than 2.6)")
    ap.add_argument("--width", type=int, default=1024, help="hidden width (default 1024: 2.4 M "
                                                            "parameters at depth 4)")
    ap.add_argument("--depth", type=int, default=4, help="linear layers (default 4)")
    ap.add_argument("--batch", type=int, default=32, help="samples per rank per step (default 32)")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per round (default 5)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2)")
    ap.add_argument("--rounds", type=int, default=3, help="alternated rounds (default 3)")
    ap.add_argument("--bucket-mb", type=float, default=25.0,
                    help="DDP's bucket_cap_mb (default 25, DDP's own)")
    ap.add_argument("--first-bucket-mb", type=float, default=1.0,
                    help="the cap of DDP's first (last layer's) bucket (default 1, DDP's own)")
    ap.add_argument("--lr", type=float, default=0.05, help="SGD's learning rate (default 0.05)")
    ap.add_argument("--seed", type=int, default=1, help="model and data seed (default 1)")
    return ap


def check(ap: argparse.ArgumentParser,
          args: argparse.Namespace) -> tuple[list[str], list[str], tuple[str, ...]]:
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    hooks = [h.strip() for h in args.hooks.split(",") if h.strip()]
    wraps = tuple(w.strip() for w in args.wraps.split(",") if w.strip())
    if len(set(wraps)) != len(wraps) or any(w not in sharded.SHARDED for w in wraps):
        ap.error(f"--wraps {args.wraps!r}: comma-separated, of {', '.join(sharded.SHARDED)}")
    if not backends or len(set(backends)) != len(backends) or \
            any(b not in ("rxelab", "gloo") for b in backends):
        ap.error(f"--backends {args.backends!r}: distinct names of rxelab and gloo")
    if not hooks or any(h not in HOOKS for h in hooks):
        ap.error(f"--hooks {args.hooks!r}: comma-separated, of {', '.join(HOOKS)}")
    for name in ("width", "depth", "batch", "steps", "rounds"):
        if getattr(args, name) < (2 if name == "depth" else 1):
            ap.error(f"--{name} must be at least {2 if name == 'depth' else 1}")
    if args.warmup < 1:
        ap.error("--warmup must be at least 1 (DDP rebuilds its buckets after the first step)")
    for name in ("bucket_mb", "first_bucket_mb"):
        if not 0 < getattr(args, name) <= 1024:
            ap.error(f"--{name.replace('_', '-')} must be above 0 and at most 1024")
    return backends, hooks, wraps


def summary(v: Variant, rounds: list[Result], p: int, same: bool, vs: dict[str, Any],
            args: argparse.Namespace) -> dict[str, Any]:
    """One JSON line: medians over the rounds of each round's median."""
    per_round = [statistics.median(r.step_s) for r in rounds]
    buckets = sorted(rounds[-1].bucket_bytes)
    bucket_ms = {str(i): round(1e3 * statistics.median(
        statistics.median(r.bucket_s[i]) for r in rounds if r.bucket_s.get(i)), 3) for i in buckets}
    return {"app": "ddp", "variant": v.name, "backend": v.backend, "hook": v.hook, "wrap": v.wrap,
            "ranks": p,
            "params": int(rounds[-1].params.numel()),  # FSDP's shards have no bucket cap:
            "bucket_mb": args.bucket_mb if v.wrap == "ddp" else None,
            "first_bucket_mb": args.first_bucket_mb if v.wrap == "ddp" else None,
            "bucket_bytes": [rounds[-1].bucket_bytes[i] for i in buckets],
            "step_ms": round(1e3 * statistics.median(per_round), 3),
            "step_ms_rounds": [round(1e3 * x, 3) for x in per_round],
            "step_ms_min": round(1e3 * min(per_round), 3),
            "step_ms_max": round(1e3 * max(per_round), 3),
            "bucket_ms": bucket_ms, "steps": args.steps, "rounds": args.rounds,
            "same_on_every_rank": same, "digest": digest(rounds[-1].params), **vs}


def main(argv: list[str] | None = None) -> int:
    ap = arguments()
    args = ap.parse_args(argv)
    backends, hooks, wraps = check(ap, args)
    gloo_compare.launched(ap)
    try:
        import rxelab.torch as rxelab_torch
        import torch.distributed as dist
    except ImportError as err:
        print(gloo_compare.no_torch(err), file=sys.stderr)
        return 2
    if "gloo" in backends and (wrong := gloo_compare.gloo_interface()) is not None:
        print(wrong, file=sys.stderr)
        return 2
    timeout = datetime.timedelta(seconds=INIT_TIMEOUT_S)
    try:
        dist.init_process_group(backends[0], init_method="env://", timeout=timeout)
    except (RuntimeError, ValueError) as err:  # the store unreachable, a rank that never came
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        print(f"error: {backends[0]}'s rendezvous failed: {first}", file=sys.stderr)
        return 2
    rank, p = dist.get_rank(), dist.get_world_size()
    logging.getLogger("torch.nn.parallel.distributed").setLevel(logging.WARNING)  # per DDP
    first_bucket(args.first_bucket_mb)
    groups: dict[str, Any] = {backends[0]: None}
    for b in backends[1:]:
        groups[b] = dist.new_group(backend=b, timeout=timeout)
    gloo_bf16 = "gloo" not in groups or "bf16" not in hooks or gloo_sums_bf16(groups["gloo"])
    if not gloo_bf16 and rank == 0:
        print("# gloo+bf16 is not run: this torch's Gloo has no bfloat16 all_reduce", flush=True)
    # a wrap this torch cannot run is a line per backend that says why (every rank alike)
    cannot = {w: why for w in wraps if (why := sharded.unsupported(w)) is not None}
    for w, why in cannot.items():
        for b in backends:
            if rank == 0:
                print(json.dumps({"app": "ddp", "variant": Variant(b, "none", w).name,
                                  "backend": b, "wrap": w, "skipped": why}), flush=True)
    chosen = variants(backends, hooks, args.codec, gloo_bf16,
                      tuple(w for w in wraps if w not in cannot))
    if any(v.hook == CODEC for v in chosen):
        groups[CODEC] = dist.new_group(backend="rxelab", timeout=timeout,
                                       pg_options=rxelab_torch.Options(compression="fp16"))
    results: dict[Variant, list[Result]] = {v: [] for v in chosen}
    for r in range(args.rounds):
        for v in chosen:  # A, B, A, B: each round in the same order
            group = groups[CODEC if v.hook == CODEC else v.backend]
            results[v].append(train(group, "none" if v.hook == CODEC else v.hook, args, rank,
                                    v.wrap))
            if rank == 0:
                print(f"# round {r + 1}/{args.rounds} {v.name}: "
                      f"{1e3 * statistics.median(results[v][-1].step_s):.1f} ms/step", flush=True)
    last = {v: rs[-1] for v, rs in results.items()}
    digests: list[Any] = [None] * p
    dist.all_gather_object(digests, {v.name: digest(res.params) for v, res in last.items()})
    against = compare(last)
    ok = True
    for v in chosen:
        same = all(d[v.name] == digests[0][v.name] for d in digests)
        ok = ok and same and against[v].get("matches", True)
        if rank == 0:
            print(json.dumps(summary(v, results[v], p, same, against[v], args)), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
