"""rxelab-bench speaks the dialects a newcomer already types (issue 59): OSU's -m/-i/-x/-f,
nccl-tests' -b/-e/-f/-n/-w/-c and perftest's -d/--ib-port/--gid-index; one letter keeps one
meaning and the help's table says where the other went; every wrong value is a usage error
that says why, before any rank starts; and the calls per size are OSU's by default."""

import pytest
from rxelab import bench, bench_flags
from rxelab.errors import ConfigError


def sizes(*argv: str) -> list[int]:
    ap = bench_flags.parser()
    return bench_flags.chosen_sizes(ap, ap.parse_args(list(argv)))


def usage_error(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as stop:
        bench.main(list(argv))
    assert stop.value.code == 2, "a usage error, not a traceback or a run"
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_nccl_tests_sizes_step_by_a_factor_as_nccl_tests_does():
    assert sizes("-b", "1K", "-e", "4K", "-f", "2") == [1024, 2048, 4096]
    assert sizes("--minbytes", "1k", "--maxbytes", "4k", "--stepfactor", "4") == [1024, 4096]
    assert sizes("-b", "1K", "-e", "4K") == [1024, 2048, 4096], "-f defaults to 2"
    big = sizes("--op", "allreduce", "-b", "8", "-e", "128M", "-f", "2")
    assert big[0] == 8 and big[-1] == 128 << 20 and len(big) == 25
    assert sizes("-b", "1K", "-e", "4K", "--stepbytes", "1024") == [1024, 2048, 3072, 4096]
    assert sizes("--op", "allreduce", "-e", "16") == [4, 8, 16], "-b defaults to one element"
    assert sizes("-b", "0", "-e", "4") == [0, 1, 2, 4]
    assert sizes("-b", "512K")[-1] == 1 << 20, "-e defaults to 1M"


def test_osu_and_nccl_tests_name_the_same_calls():
    ap = bench_flags.parser()
    said = {tuple(argv): (a.iterations, a.warmup) for argv in
            (["-i", "7", "-x", "3"], ["-n", "7", "-w", "3"], ["--iterations", "7", "--warmup", "3"],
             ["--iters", "7", "--warmup_iters", "3"]) for a in [ap.parse_args(argv)]}
    assert set(said.values()) == {(7, 3)}, said
    a = ap.parse_args(["-d", "mlx5_1", "--ib-port", "2", "--gid-index", "3"])
    assert (a.device, a.ib_port, a.gid_index) == ("mlx5_1", 2, 3)
    assert ap.parse_args(["--ib-dev", "mlx5_1"]).device == "mlx5_1", "perftest's long name"
    assert ap.parse_args(["-c"]).check == 1 and ap.parse_args(["-c", "0"]).check == 0
    assert ap.parse_args([]).check == 1
    assert ap.parse_args(["--full"]).full


def test_calls_per_size_are_osus_unless_told():
    ap = bench_flags.parser()
    default = ap.parse_args([])
    assert bench_flags.calls(8192, default) == bench_flags.Calls(1000, 100)
    assert bench_flags.calls(8193, default) == bench_flags.Calls(100, 10)
    told = ap.parse_args(["-i", "7", "-x", "0"])
    assert bench_flags.calls(1, told) == bench_flags.calls(1 << 20, told) == bench_flags.Calls(7, 0)
    assert bench_flags.calls_said(default) == ("iterations 1000 up to 8192 bytes, 100 above; "
                                               "warm-up 100 up to 8192 bytes, 10 above")


@pytest.mark.parametrize("argv, said", [
    (["-b", "4K", "-e", "1K"], "-b 4096 is above -e 1024"),
    (["-b", "1K", "-e", "4K", "-f", "1"], "nccl-tests' -f 1 steps by -i bytes; say --stepbytes N"),
    (["-f", "3x"], "the factor between sizes, a whole number from 2"),
    (["-b", "1K", "-f"], "OSU's -f (full rows) is --full"),
    (["-b", "12X"], "a whole number of bytes, with K, M or G"),
    (["-e", "2G"], "sizes at most 1073741824 (1G)"),
    (["--op", "allreduce", "-b", "1", "-e", "8"],
     "allreduce moves float32 elements of 4 bytes: 1, 2 bytes is not a whole number"),
    (["-b", "1K", "--sizes", "1024"], "-b (nccl-tests' sizes) and --sizes: one way"),
    (["-e", "1K", "-m", "1024"], "-e (nccl-tests' sizes) and -m: one way"),
    (["-f", "2", "--stepbytes", "8"], "not both"),
    (["--stepbytes", "1", "-e", "1G"], "makes 1073741824 sizes: at most 1000"),
    (["-c", "2"], "invalid choice: 2"),
    (["--ib-port", "0"], "the RDMA device's port, a whole number from 1"),
    (["--gid-index", "-1"], "the port's GID index, a whole number from 0"),
    (["--transport", "tcp", "--gid-index", "1"],
     "--ib-port and --gid-index choose an RDMA port; transport tcp has none"),
    (["-n", "0"], "--iterations must be >= 1"),
    (["-w", "-1"], "--warmup >= 0"),
])
def test_a_wrong_dialect_flag_is_a_usage_error_that_says_why(capsys, argv, said):
    assert said in usage_error(capsys, *argv)


def test_a_bad_transport_in_the_environment_is_a_usage_error(capsys, monkeypatch):
    monkeypatch.setenv("RXELAB_TRANSPORT", "bogus")
    assert "RXELAB_TRANSPORT='bogus': no such transport" in usage_error(capsys, "--sizes", "1")


def test_the_help_ends_with_the_dialects_table(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--help"])
    out = capsys.readouterr().out
    table = out[out.index("dialects"):]
    for flag in ("-m MIN:MAX", "-b MIN -e MAX", "--stepbytes", "--full", "-c [0|1]", "-d NAME",
                 "--ib-port N", "--gid-index N", "-i N = -n N", "-x N = -w N"):
        assert flag in table, flag


def test_the_device_port_and_gid_flags_reach_init(monkeypatch, capsys):
    got = {}

    def init(**kwargs):
        got.update(kwargs)
        raise ConfigError("stop here")

    monkeypatch.setattr(bench.rxelab, "init", init)
    assert bench.main(["-d", "mlx5_1", "--ib-port", "2", "--gid-index", "3", "--sizes", "1"]) == 2
    assert (got["device"], got["port"], got["gid_index"]) == ("mlx5_1", 2, 3)
    assert capsys.readouterr().err.strip() == "bench: stop here"
