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

from apps import ddp_train, sharded
from experiments.spec import scenarios
from tests.torch.groups import environ, run_groups

P = 3


def args(**over) -> argparse.Namespace:
    base = ddp_train.arguments().parse_args(["--width", "64", "--depth", "3", "--batch", "8",
                                             "--steps", "3", "--warmup", "1",
                                             "--bucket-mb", "0.02", "--first-bucket-mb", "0.01"])
    return argparse.Namespace(**{**vars(base), **over})


def run(backend: str, hook: str, wrap: str = "ddp", **options) -> list[ddp_train.Result]:
    a = args()
    first = dist._DEFAULT_FIRST_BUCKET_BYTES
    ddp_train.first_bucket(a.first_bucket_mb)
    try:
        with environ(GLOO_SOCKET_IFNAME="lo"):
            return run_groups(P, lambda pg: ddp_train.train(pg, hook, a, pg.rank(), wrap), backend,
                              deadline=60, **options)
    finally:
        dist._DEFAULT_FIRST_BUCKET_BYTES = first


def test_a_ddp_spec_names_the_hooks_and_wraps_the_app_takes() -> None:
    assert scenarios.DDP_HOOKS == ddp_train.HOOKS
    assert scenarios.WRAPS == sharded.SHARDED


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


def test_fsdp_is_refused_in_one_line_where_this_torch_cannot_run_it():
    import sys
    why = sharded.unsupported("fsdp")
    if torch.__version__.startswith("1.") and sys.version_info >= (3, 11):  # Debian 12's
        assert why is not None and "FSDP does not import" in why, why
    else:
        assert why is None, why
    why2 = sharded.unsupported("fsdp2")
    assert (why2 is None) == (sharded.torch_major_minor() >= (2, 6) and
                              sharded.cpu_streams_record_events()), why2
    if sharded.torch_major_minor() < (2, 0) or sharded.torch_major_minor() >= (2, 13):
        assert sharded.cpu_streams_record_events() == (sharded.torch_major_minor() >= (2, 13)), \
            "1.13 has no CPU stream, 2.13's records events (2.6's does not: the lab's e2e)"


@pytest.mark.skipif(sharded.unsupported("fsdp") is not None, reason="no FSDP under this torch")
def test_fsdp_on_rxelab_ends_where_fsdp_on_gloo_and_ddp_do():
    """FSDP's traffic is all_gather_into_tensor and reduce_scatter_tensor, layer by layer: the
    same training as DDP's all_reduce, so the same parameters within the tolerance."""
    mine, gloo, ddp = run("rxelab", "none", "fsdp"), run("gloo", "none", "fsdp"), run("rxelab", "none")
    assert all(torch.equal(r.params, mine[0].params) for r in mine), "every rank the same"
    fsdp = ddp_train.Variant("rxelab", "none", "fsdp")
    assert fsdp.name == "rxelab+fsdp" and fsdp.reference() == ddp_train.Variant("gloo", "none", "fsdp")
    verdict = ddp_train.compare({fsdp: mine[0], fsdp.reference(): gloo[0]})[fsdp]
    assert verdict["matches"] and verdict["reference"] == "gloo+fsdp", verdict
    assert mine[0].params.shape == ddp[0].params.shape, "every parameter, gathered whole"
    assert torch.allclose(mine[0].params, ddp[0].params, rtol=1e-4, atol=1e-5), \
        "sharded or not, the same training"
    mine[0].params[3] += 1e-2
    assert not ddp_train.compare({fsdp: mine[0], fsdp.reference(): gloo[0]})[fsdp]["matches"]


def test_the_app_refuses_an_unknown_wrap_in_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        ddp_train.main(["--wraps", "fsdp,zero3"])
    assert e.value.code == 2 and "--wraps 'fsdp,zero3': comma-separated, of fsdp, fsdp2" in \
        capsys.readouterr().err
