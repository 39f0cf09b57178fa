"""The DDP scenario of a spec's [ddp] table: apps/ddp_train.py trains the same model with
DistributedDataParallel under rxelab and under Gloo (and with DDP's compression hooks, and
rxelab's own codec), alternated round by round inside one job, started by our launcher on the
first `nodes` nodes, once per bucket size; the sharded variants (FSDP, FSDP2: `wraps`), which
have no bucket cap, only in the first job. Each variant's JSON line becomes a record of
ddp.jsonl, with the bucket size it ran at (none for FSDP's); a job that fails, or a variant
this torch cannot run, leaves a record that says why.

Nodes without torch (a lab built without EXTRAS=torch) run nothing: the records say so. The
job's processes carry the run's id, so the run's clean-up stops whatever it left.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from invoke.exceptions import CommandTimedOut

from experiments.running import commands, fleet
from experiments.running.commands import started_by
from experiments.running.scenario_records import DdpRecord
from experiments.spec.scenarios import DdpDoc
from infra.inventory import Host

PORT = 29660  # the job's rendezvous on the first node (torch's store; rxelab's meets in it)


def app_argv(dd: DdpDoc, bucket_mb: float, first: bool = True) -> list[str]:
    """The app's command at one bucket cap; the sharded variants (FSDP's own buckets, no
    DDP cap) only in the first job."""
    p = fleet.remote_paths()
    return [p["python"], f"{p['apps']}/ddp_train.py", "--width", str(dd.width),
            "--depth", str(dd.depth), "--batch", str(dd.batch), "--steps", str(dd.steps),
            "--warmup", str(dd.warmup), "--rounds", str(dd.rounds),
            "--hooks", ",".join(dd.hooks), *(["--codec"] if dd.codec else []),
            *(["--wraps", ",".join(dd.wraps)] if dd.wraps and first else []),
            "--bucket-mb", f"{bucket_mb:g}", "--first-bucket-mb", f"{bucket_mb:g}"]


def job_command(dd: DdpDoc, hosts: list[Host], run_id: str, bucket_mb: float,
                first: bool = True) -> str:
    argv = [fleet.remote_paths()["python"], "-m", "rxelab.launch", "--hosts",
            ",".join(h.data_ip for h in hosts), "--port", str(PORT), "--timeout",
            str(dd.timeout_s), "--", *app_argv(dd, bucket_mb, first)]
    return started_by(run_id) + commands.remote_join(argv)


def parse(output: str) -> list[DdpRecord]:
    """The app's JSON lines (rank 0's, as our launcher prefixes them: "[0] {...}")."""
    found = []
    for line in output.splitlines():
        text = line.split("] ", 1)[1] if line.startswith("[") and "] " in line else line
        if not text.startswith("{"):
            continue
        try:
            got = json.loads(text)
        except ValueError:
            continue
        if isinstance(got, dict) and got.get("app") == "ddp":
            found.append(DdpRecord.model_validate(got))
    return found


class Scenario:
    """One run of the spec's [ddp] table on the runner's nodes (see the module's docstring)."""

    def __init__(self, runner: Any) -> None:
        self.r = runner
        self.dd: DdpDoc = runner.spec.ddp
        self.hosts: list[Host] = runner.hosts[:self.dd.nodes]

    def run(self) -> Iterator[DdpRecord]:
        lacking = [h.name for h in self.hosts if h.name not in self.r.with_torch]
        for i, mb in enumerate(self.dd.bucket_mb):
            if lacking:
                yield DdpRecord(bucket_mb=mb, status="skipped",
                                error=f"no torch on {', '.join(lacking)} (make provision EXTRAS=torch)")
                continue
            self.r.say(f"[{i + 1}/{len(self.dd.bucket_mb)}] ddp: {len(self.hosts)} nodes, "
                       f"buckets of {mb:g} MB, {self.dd.rounds} rounds")
            try:
                result = self.r._connection(self.hosts[0]).run(
                    job_command(self.dd, self.hosts, self.r.run_id, mb, first=i == 0), hide=True,
                    warn=True,
                    timeout=self.dd.timeout_s + 60)
            except CommandTimedOut:
                yield DdpRecord(bucket_mb=mb, status="failed", exit=commands.TIMED_OUT,
                                error=f"the job did not end within {self.dd.timeout_s + 60} s")
                continue
            lines = parse(result.stdout)
            for line in lines:  # a variant this torch cannot run: its line says why
                cap = mb if (line.wrap or "ddp") == "ddp" else None  # FSDP shards, no buckets
                yield (DdpRecord(bucket_mb=cap, status="skipped", variant=line.variant,
                                 error=line.skipped)
                       if line.skipped is not None else DdpRecord.model_validate(
                           {"status": "ok", **line.model_dump(exclude_unset=True), "bucket_mb": cap}))
            if result.exited != 0 or not lines:
                tail = "\n".join((result.stdout + result.stderr).splitlines()[-15:])[-3000:]
                yield DdpRecord(bucket_mb=mb, status="failed", exit=result.exited, error=tail)
            for line in lines:
                if line.skipped is not None:
                    self.r.say(f"    {line.variant}: not run: {line.skipped}")
                    continue
                self.r.say(f"    {line.variant}: {line.step_ms:.0f} ms/step"
                           + ("" if line.matches is not False and line.same_on_every_rank
                              else " (PARAMETERS DIFFER)"))
