"""DDP's loop on the rxelab backend against the same loop on Gloo (TCP over loopback), on the
host: apps/ddp_train.py's own train(), a few steps of a small MLP, three ranks as threads.
Every rank must end with the same parameters, and rxelab's must match Gloo's within the
demo's float tolerance, with DDP's plain allreduce hook and with its fp16 and bf16 hooks
(torch 1.13's Gloo has no bfloat16 all_reduce: bf16 is held to uncompressed Gloo)."""

from __future__ import annotations

import argparse

import pytest
import torch
import torch.distributed as dist

from apps import ddp_train
from tests.torch.groups import environ, run_groups

P = 3


def args(**over) -> argparse.Namespace:
    base = ddp_train.arguments().parse_args(["--width", "64", "--depth", "3", "--batch", "8",
                                             "--steps", "3", "--warmup", "1",
                                             "--bucket-mb", "0.02", "--first-bucket-mb", "0.01"])
    return argparse.Namespace(**{**vars(base), **over})


def run(backend: str, hook: str, **options) -> list[ddp_train.Result]:
    a = args()
    first = dist._DEFAULT_FIRST_BUCKET_BYTES
    ddp_train.first_bucket(a.first_bucket_mb)
    try:
        with environ(GLOO_SOCKET_IFNAME="lo"):
            return run_groups(P, lambda pg: ddp_train.train(pg, hook, a, pg.rank()), backend,
                              deadline=60, **options)
    finally:
        dist._DEFAULT_FIRST_BUCKET_BYTES = first


@pytest.mark.parametrize("hook", ddp_train.HOOKS)
def test_ddp_on_rxelab_ends_where_ddp_on_gloo_does(hook):
    reference = ddp_train.Variant("rxelab", hook).reference()  # bf16: Gloo 1.13 cannot
    mine, gloo = run("rxelab", hook), run("gloo", reference.hook)
    for results in (mine, gloo):
        assert all(torch.equal(r.params, results[0].params) for r in results), \
            "every rank holds the same parameters"
    got = ddp_train.compare({ddp_train.Variant("rxelab", hook): mine[0], reference: gloo[0]})
    verdict = got[ddp_train.Variant("rxelab", hook)]
    assert verdict["matches"], verdict
    if hook != "none":
        assert verdict["max_abs_diff"] > 0, "compressed: not bit for bit what the other did"
    start = ddp_train.build_model(64, 3, 1)
    assert not torch.allclose(mine[0].params, torch.cat(
        [p.detach().reshape(-1) for p in start.parameters()])), "it trained"
    assert len(mine[0].bucket_bytes) > 1, "several gradient buckets, each timed"
    assert all(len(times) == 3 for times in mine[0].bucket_s.values())


def test_rxelabs_fp16_codec_stays_within_its_tolerance_of_uncompressed_gloo():
    mine = run("rxelab", "none", compression="fp16", settings={"eager_limit": 0})
    gloo = run("gloo", "none")
    got = ddp_train.compare({ddp_train.Variant("rxelab", ddp_train.CODEC): mine[0],
                             ddp_train.Variant("gloo", "none"): gloo[0]})
    verdict = got[ddp_train.Variant("rxelab", ddp_train.CODEC)]
    assert verdict["matches"] and verdict["max_abs_diff"] > 0, verdict


def test_a_wrong_parameter_is_found():
    mine, gloo = run("rxelab", "none"), run("gloo", "none")
    mine[0].params[7] += 1e-2
    got = ddp_train.compare({ddp_train.Variant("rxelab", "none"): mine[0],
                             ddp_train.Variant("gloo", "none"): gloo[0]})
    assert not got[ddp_train.Variant("rxelab", "none")]["matches"]
