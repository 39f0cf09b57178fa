"""The library as the wheel a cluster user installs (issue 28, item 1): `pip wheel lib/`
builds it with every subpackage, numpy as its only dependency (pyverbs is the system's), a
version and three console scripts; installed into a fresh venv (numpy seen from outside, as a
node sees Debian's), it runs a collective, the self-test and the benchmark from there - not
from the source tree - on the in-memory fabric standing in for the system's pyverbs."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import numpy
import pytest
import rxelab

from tests.unit.fakejob import free_port

pytestmark = pytest.mark.slow  # pip wheel, a venv, the installed scripts run

REPO = Path(__file__).resolve().parents[2]
FAKEVERBS = REPO / "tests" / "fakeverbs"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """`pip wheel lib/`, as fab deploy runs it (on a copy of lib/: no build files left in the
    checkout)."""
    from experiments.running import deploy

    found = deploy.build_wheel(tmp_path_factory.mktemp("dist"))
    assert not (REPO / "lib" / "build").exists(), "the build wrote into the checkout"
    return found


def test_the_wheel_holds_every_subpackage_its_scripts_and_only_numpy(wheel):
    z = zipfile.ZipFile(wheel)
    names = set(z.namelist())
    sources = {p.relative_to(REPO / "lib").as_posix() for p in (REPO / "lib" / "rxelab").rglob("*.py")}
    assert sources and sources <= names, f"missing from the wheel: {sorted(sources - names)}"
    assert "rxelab/collectives/alltoall_sequential.py" in names
    assert wheel.name.startswith(f"rxelab-{rxelab.__version__}-")
    info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
    meta = z.read(f"{info}/METADATA").decode()
    required = [line.split(":", 1)[1].strip() for line in meta.splitlines()
                if line.startswith("Requires-Dist:")]
    plain = [r for r in required if "extra ==" not in r]
    assert plain == ["numpy>=1.24"], required
    scripts = z.read(f"{info}/entry_points.txt").decode()
    for script, target in (("rxelab-launch", "rxelab.launch:main"),
                           ("rxelab-bench", "rxelab.bench:main"),
                           ("rxelab-selftest", "rxelab.selftest:main")):
        assert f"{script} = {target}" in scripts
    assert not any(n.startswith(("infra/", "experiments/", "apps/", "tests/")) for n in names)


def test_the_wheel_carries_its_licence_its_type_hints_and_its_extras(wheel):
    """Issue 59: the licence in the metadata (PEP 639) and its text in the wheel, py.typed (PEP 561:
    else a user's type checker ignores the library's hints), classifiers, the torch extra."""
    z = zipfile.ZipFile(wheel)
    names = set(z.namelist())
    assert "rxelab/py.typed" in names
    info = f"rxelab-{rxelab.__version__}.dist-info"
    assert z.read(f"{info}/licenses/LICENSE") == (REPO / "LICENSE").read_bytes()
    meta = z.read(f"{info}/METADATA").decode().split("\n\n", 1)[0].splitlines()  # headers only
    assert "License-Expression: MIT" in meta and "License-File: LICENSE" in meta, meta
    classifiers = {line.split(": ", 1)[1] for line in meta if line.startswith("Classifier: ")}
    assert {"Typing :: Typed", "Programming Language :: Python :: 3.13",
            "Topic :: System :: Distributed Computing"} <= classifiers, classifiers
    assert not any(c.startswith("License ::") for c in classifiers), "PEP 639: the expression alone"
    assert 'Requires-Dist: torch>=1.13; extra == "torch"' in meta, meta
    assert not any(line.startswith("Project-URL:") for line in meta), "the project has no address"


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(home)], check=True, timeout=300,
                   capture_output=True)
    r = subprocess.run([str(home / "bin" / "pip"), "install", "-q", "--no-index", "--no-deps",
                        "--disable-pip-version-check", str(wheel)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    # numpy as a node has it (the system's), and nothing else from outside
    system = home / "system"
    system.mkdir()
    found = Path(numpy.__file__).parent
    for part in (found, found.parent / "numpy.libs"):
        if part.exists():
            (system / part.name).symlink_to(part)
    site = next((home / "lib").glob("python3*/site-packages"))
    (site / "system-numpy.pth").write_text(f"{system}\n")
    return home


def run_in(venv: Path, argv: list[str], tmp_path: Path,
           pyverbs: bool = True) -> subprocess.CompletedProcess[str]:
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)}
    if pyverbs:  # the in-memory fabric (a node: the system's)
        env["PYTHONPATH"] = str(FAKEVERBS)
    return subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_without_pyverbs_the_wheel_runs_its_selftest_and_bench_over_tcp(venv, tmp_path):
    """A laptop or a CI runner: no RDMA, no pyverbs; transport=tcp runs the real library."""
    py = str(venv / "bin" / "python")
    r = run_in(venv, [py, "-c", "import rxelab.comm, sys; print('pyverbs' in sys.modules)"],
               tmp_path, pyverbs=False)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stdout + r.stderr
    port = str(free_port())
    r = run_in(venv, [str(venv / "bin" / "rxelab-launch"), "--hosts", "localhost", "--per-host",
                      "3", "--port", port, "--timeout", "240", "--", str(venv / "bin" / "rxelab-selftest"),
                      "--transport", "tcp", "--sizes", "0,7,70000"], tmp_path, pyverbs=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summaries = [json.loads(x.split("] ", 1)[1]) for x in r.stdout.splitlines() if '"summary"' in x]
    assert len(summaries) == 3 and all(s["failed"] == 0 and s["checks"] > 10 for s in summaries), \
        r.stdout[-3000:]
    r = run_in(venv, [str(venv / "bin" / "rxelab-launch"), "--hosts", "localhost", "--per-host",
                      "2", "--port", str(free_port()), "--timeout", "240", "--",
                      str(venv / "bin" / "rxelab-bench"), "--transport", "tcp", "--op", "allreduce",
                      "--sizes", "1024,1048576", "--iterations", "3"], tmp_path, pyverbs=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "transport tcp from 127.0.0.1, ranks 2" in r.stdout, r.stdout
    rows = [line.split() for line in r.stdout.splitlines()
            if line.split()[1:2] in (["1024"], ["1048576"])]  # "[0] size ... #wrong"
    assert len(rows) >= 4 and all(row[-1] == "0" for row in rows), r.stdout  # two per algorithm
    # verbs, without pyverbs: one line that names what to install
    r = run_in(venv, [str(venv / "bin" / "rxelab-launch"), "--hosts", "localhost", "--port",
                      str(free_port()), "--timeout", "120", "--",
                      str(venv / "bin" / "rxelab-selftest")], tmp_path, pyverbs=False)
    assert r.returncode != 0 and "python3-pyverbs" in r.stdout, r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr


def test_the_installed_wheel_runs_a_collective_the_selftest_and_the_bench(venv, tmp_path):
    py = str(venv / "bin" / "python")
    r = run_in(venv, [py, "-c", "import rxelab, numpy; print(rxelab.__file__, rxelab.__version__)"],
               tmp_path)
    assert r.returncode == 0, r.stderr
    where, version = r.stdout.split()
    assert where.startswith(str(venv)) and version == rxelab.__version__, "not the installed wheel"

    collective = textwrap.dedent("""
        import socket, threading, numpy as np, rxelab
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
        out = {}
        def rank(r):
            with rxelab.init(r, 3, "127.0.0.1", port, device="fake0", timeout=20) as comm:
                x = np.arange(3 * 8, dtype=np.uint8) + 10 * r
                y = np.zeros_like(x)
                comm.alltoall(x, y, algorithm="sequential")
                out[r] = y.tolist()
        ts = [threading.Thread(target=rank, args=(r,)) for r in range(3)]
        [t.start() for t in ts]; [t.join(60) for t in ts]
        print(out[0][:8] == list(range(8)) and out[1][8:16] == [18 + i for i in range(8)])
    """)
    r = run_in(venv, [py, "-c", collective], tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "True", r.stdout + r.stderr

    r = run_in(venv, [str(venv / "bin" / "rxelab-selftest"), "--sizes", "0,7,4096"], tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    summary = [json.loads(x) for x in r.stdout.splitlines() if '"summary"' in x]
    assert summary and summary[-1]["failed"] == 0 and summary[-1]["checks"] > 0

    r = run_in(venv, [str(venv / "bin" / "rxelab-bench"), "--op", "allreduce", "--sizes", "1024",
                      "--iterations", "2", "--warmup", "0"], tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert any(line.split()[:1] == ["1024"] for line in r.stdout.splitlines()), r.stdout

    # our launcher, from the wheel: a rank of one on this host, with the job's environment
    r = run_in(venv, [str(venv / "bin" / "rxelab-launch"), "--hosts", "localhost", "--timeout",
                      "120", "--", py, "-c", "import os, rxelab; print(os.environ['RANK'], "
                      "os.environ['WORLD_SIZE'], rxelab.__file__)"], tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"[0] 0 1 {where}" in r.stdout, r.stdout


def test_deploys_own_steps_install_the_wheel_and_say_its_version(tmp_path):
    """What `fab deploy` runs on a node, run here in a home of its own: the bundle unpacked,
    the venv made (seeing the system's packages), the wheel installed offline, and the check
    reads the installed version back (before, a quoting slip made it say "not installed")."""
    from experiments.running import deploy, fleet

    data, digest = deploy.bundle()
    home = tmp_path / "home"
    (home / fleet.REMOTE_HOME).mkdir(parents=True)
    (home / fleet.REMOTE_HOME / f".bundle-{digest}.tgz").write_bytes(data)
    env = {"HOME": str(home), "PATH": "/usr/local/bin:/usr/bin:/bin"}
    unpack = subprocess.run(["sh", "-c", deploy.UNPACK.format(home=fleet.REMOTE_HOME, digest=digest)],
                            env=env, capture_output=True, text=True, timeout=300)
    assert unpack.returncode == 0 and "PROBLEM" not in unpack.stdout, unpack.stdout + unpack.stderr
    assert (home / fleet.REMOTE_HOME / ".deployed").read_text().strip() == digest
    check = subprocess.run(["sh", "-c", "dev=fake0; port=1; " + deploy.CHECK.format(
        home=fleet.REMOTE_HOME)], env=env, capture_output=True, text=True, timeout=120)
    assert f"VERSION: {rxelab.__version__}" in check.stdout, check.stdout + check.stderr
    assert "wheel is not installed" not in check.stdout
