"""The benchmark's command line refuses what it cannot measure before it starts a rank: sizes
that are not whole elements of the op's dtype, bad ranges, unknown algorithms; it takes OSU's
-m [MIN:]MAX, and every flag says what it does."""

import pytest
from rxelab import bench, bench_flags, bench_report


def usage_error(capsys, *argv):
    with pytest.raises(SystemExit) as stop:
        bench.main(list(argv))
    assert stop.value.code == 2, "a usage error, not a traceback or a run"
    return capsys.readouterr().err


def test_a_size_that_is_not_whole_elements_is_refused(capsys):
    err = usage_error(capsys, "--op", "allreduce", "--sizes", "1,1024,6")
    assert "allreduce moves float32 elements of 4 bytes: 1, 6 bytes is not a whole number" in err


@pytest.mark.parametrize("argv, said", [
    (["--sizes", "1k"], "comma-separated whole numbers of bytes"),
    (["--sizes", "-4"], "none below 0"),
    (["-m", "8:4"], "0 <= MIN <= MAX"),
    (["-m", "x"], "[MIN:]MAX in bytes"),
    (["-m", "1:8", "--sizes", "4"], "not allowed with argument"),
    (["--algorithms", "pairwise,fastest"], "unknown algorithms ['fastest']: alltoall has"),
    (["--iterations", "0"], "--iterations must be >= 1"),
    (["--op", "allreduce", "-m", "2"], "no size up to 2 bytes holds one 4-byte element")])
def test_bad_flags_are_usage_errors_that_say_why(capsys, argv, said):
    assert said in usage_error(capsys, *argv)


def test_osu_style_ranges_are_powers_of_two_from_min_to_max():
    ap = bench_flags.parser()
    sizes = lambda *argv: bench_flags.chosen_sizes(ap, ap.parse_args(list(argv)))  # noqa: E731
    assert sizes("-m", "1024:16384") == [1024, 2048, 4096, 8192, 16384]
    assert sizes("-m", "0:4") == [0, 1, 2, 4]
    assert sizes("--op", "allreduce", "-m", "16") == [4, 8, 16], "MIN defaults to one element"
    assert sizes("--op", "allreduce") == [16, 1024, 16384, 65536, 262144, 1048576], \
        "the default sizes keep only whole elements"
    assert sizes("--sizes", "1,3") == [1, 3], "all-to-all counts bytes"


def test_every_flag_has_help():
    missing = [a.option_strings for a in bench_flags.parser()._actions if not a.help]
    assert missing == []


@pytest.mark.parametrize("value", [":", "0:", "1:2:3", "-1:4", "0:99999999999999999999"])
def test_a_range_that_is_no_range_or_too_big_is_refused(capsys, value):
    err = usage_error(capsys, "-m", value)
    assert "-m" in err or "--message-size" in err


def test_a_range_from_zero_keeps_its_whole_element_sizes_for_float_ops():
    ap = bench_flags.parser()
    assert bench_flags.chosen_sizes(ap, ap.parse_args(["--op", "allreduce", "-m", "0:16"])) == [0, 4, 8, 16]


def test_a_row_says_what_a_call_cost_the_cpu_and_how_often_a_rank_slept():
    """On the fake fabric the ranks are threads of one process: each rank's getrusage is the
    process's, so only the columns' presence and sign are checked here; their size, on the
    lab (issue 55's profile)."""
    from tests.unit.fakejob import run_ranks

    r = run_ranks(3, lambda comm: bench.measure(comm, "alltoall", "parallel", 1024, 3, 1))[0]
    assert r["cpu_user_us"] >= 0 and r["cpu_sys_us"] >= 0 and r["cpu_user_us"] + r["cpu_sys_us"] > 0
    assert r["sleeps"] >= 0 and r["wrong"] == 0
    fields = bench_report.row(r).split()  # size, 3 latencies, iterations, 2 bandwidths, 3 CPU, #wrong
    assert len(fields) == 11 and float(fields[7]) == round(r["cpu_user_us"]), fields
    assert fields[-1] == "0", "#wrong stays the last column (the e2e test reads it there)"
