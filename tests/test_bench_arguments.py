"""``python -m cupy_dcp.bench``'s arguments: its strategies, and those a script adds."""

import pytest

from cupy_dcp import bench


def test_the_default_strategies_are_the_librarys_own():
    assert bench.parse_args([]).strategies.split(",") == list(bench.STRATEGIES)


def test_an_unknown_strategy_is_refused_naming_the_known(capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--strategies", "raw_alltoall,bare_push"])
    err = capsys.readouterr().err
    assert "--strategies: unknown bare_push (expected some of raw_alltoall, cupy_dcp_a2a, ag_rs, " \
           "direct)" in err, err


def test_a_script_adds_its_own_strategies():
    extra = {"bare_push": lambda comm, args, B, dtype, stream: None}
    args = bench.parse_args(["--strategies", "raw_alltoall,direct,bare_push"], extra)
    assert args.strategies == "raw_alltoall,direct,bare_push"
