"""Where rxelab-launch puts a job's ranks (issue 59): --hosts in Slurm's hostlist syntax, and
--hostfile as mpirun's (`node1 slots=2`), every host name checked before it can reach ssh and
every bad line named by its file and number. Before, `--hosts 'node[1-3]'` reached ssh as one
name ("Could not resolve hostname") and there was no hostfile."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from rxelab import hostfile
from rxelab.bootstrap import MAX_RANKS
from rxelab.errors import ConfigError
from rxelab.hostfile import HostSlots, Seat


@pytest.mark.parametrize("text, hosts", [
    ("node1,node2", ["node1", "node2"]),
    ("node[1-3,7]", ["node1", "node2", "node3", "node7"]),
    ("gpu[01-04]-ib", ["gpu01-ib", "gpu02-ib", "gpu03-ib", "gpu04-ib"]),
    ("login,node[1-2],gpu[9-10]", ["login", "node1", "node2", "gpu9", "gpu10"]),
    ("localhost,127.0.0.1,::1", ["localhost", "127.0.0.1", "::1"]),
])
def test_hosts_take_slurm_hostlists_and_plain_names(text, hosts):
    assert hostfile.from_hostlist(text, 2) == [HostSlots(h, 2) for h in hosts]


def test_ranks_go_host_by_host_with_each_host_s_slots_and_local_ranks():
    seats = hostfile.seats([HostSlots("a", 2), HostSlots("b", 1), HostSlots("a", 1)])
    assert seats == [Seat("a", 0), Seat("a", 1), Seat("b", 0), Seat("a", 2)]


def write(tmp_path: Path, text: str | bytes) -> str:
    path = tmp_path / "hosts"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return str(path)


def test_a_hostfile_has_slots_hostlists_comments_and_blank_lines(tmp_path):
    path = write(tmp_path, "# the rack\n"
                           "node[1-2] slots=3   # two GPUs each\n"
                           "\n"
                           "   \t\n"
                           "login\n"
                           "  gpu[01-02]-ib  slots=1\n"
                           "10.0.0.9 slots=02\n")
    assert hostfile.read_hostfile(path, 4) == [
        HostSlots("node1", 3), HostSlots("node2", 3), HostSlots("login", 4),
        HostSlots("gpu01-ib", 1), HostSlots("gpu02-ib", 1), HostSlots("10.0.0.9", 2)]


@pytest.mark.parametrize("text, problem", [
    ("node1\nnode2 slots=0\n", "line 2: slots=0 is not a positive integer"),
    ("node1 slots=-1\n", "line 1: slots=-1 is not a positive integer"),
    ("node1 slots=two\n", "line 1: slots=two is not a positive integer"),
    ("node1 slots=\n", "line 1: slots= is not a positive integer"),
    ("node1 slots=1.5\n", "line 1: slots=1.5 is not a positive integer"),
    ("# a\n\nnode1 max_slots=4\n", "line 3: 'max_slots=4' is not slots=N"),
    ("node1 slots 2\n", "line 1: 'slots' is not slots=N"),
    ("node1 slots=1 slots=2\n", "line 1: slots= given twice"),
    ("node[1-3\n", r"line 1: hostlist 'node\[1-3': a '\[' without its '\]'"),
    ("x;reboot\n", "line 1: hostlist 'x;reboot': 'x;reboot' is not a host name"),
    ("-oProxyCommand=x\n", "line 1: .*is not a host name"),
    ("ok\n-v\n", "line 2: '-v' is not a host name"),
    (".hidden\n", "line 1: '.hidden' is not a host name"),
    ("fe80::1%eth0\n", "line 1: 'fe80::1%eth0' is not a host name"),
    ("bob@node1\n", r"line 1: 'bob@node1': a user goes in ~/.ssh/config \(Host node1, User bob\)"),
    ("node1\n" + "x" * 300 + "\n", "line 2: 'x+' is not a host name"),
    (f"node1 slots={MAX_RANKS + 1}\n", f"line 1: slots={MAX_RANKS + 1} is more than the "
                                       f"{MAX_RANKS} ranks"),
    ("node1 slots=99999999999999999999999\n", "line 1: slots=9+ is more than"),
    (f"a slots={MAX_RANKS // 2}\nb[1-2] slots={MAX_RANKS // 2}\n",
     f"line 2: the job passes the {MAX_RANKS} ranks"),
    (f"node[1-{MAX_RANKS + 1}]\n", f"line 1: .* names more than the {MAX_RANKS} hosts"),
    ("# nothing but comments\n\n", "names no host"),
    ("", "names no host"),
    (b"node1\nn\xffde2\n", "line 2: not UTF-8 text"),
])
def test_a_bad_hostfile_is_refused_naming_its_file_and_line(tmp_path, text, problem):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=f"^{re.escape(path)}:? {problem}"):
        hostfile.read_hostfile(path, 1)


def test_an_unreadable_or_huge_hostfile_is_refused_in_words(tmp_path):
    with pytest.raises(ConfigError, match="No such file or directory"):
        hostfile.read_hostfile(str(tmp_path / "absent"), 1)
    with pytest.raises(ConfigError, match="Is a directory"):
        hostfile.read_hostfile(str(tmp_path), 1)
    path = write(tmp_path, "#" * hostfile.MAX_BYTES + "\nnode1\n")
    with pytest.raises(ConfigError, match="more than 4 MiB"):
        hostfile.read_hostfile(path, 1)


@pytest.mark.parametrize("text, problem", [
    ("node1,", "an empty name"),
    ("node1,-v", "'-v' is not a host name"),
    ("root@node1", "a user goes in ~/.ssh/config"),
    ("node1 node2", "'node1 node2' is not a host name"),
    ("node[1-10]", f"10 hosts x {MAX_RANKS} ranks is more than the {MAX_RANKS}"),
])
def test_bad_hosts_are_refused_in_words(text, problem):
    with pytest.raises(ConfigError, match=problem):
        hostfile.from_hostlist(text, MAX_RANKS if "[" in text else 1)
