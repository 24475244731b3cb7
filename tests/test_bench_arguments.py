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


@pytest.mark.parametrize("argv, message", [
    (["--mode", "graphs"], "--mode takes graph, eager or both, comma-separated (got 'graphs')"),
    (["--mode", ","], "--mode takes graph, eager or both, comma-separated (got ',')"),
    (["--tokens", "1,a"], "argument --tokens: expected comma-separated integers (got '1,a')"),
    (["--strategies", ","], "--strategies names none (got ',')"),
    (["--heads", "0"], "heads and head-dim must be >= 1 (got 0 and 512)"),
    (["--head-dim", "-4"], "heads and head-dim must be >= 1 (got 128 and -4)"),
    (["--json", "no-such-folder/x.json"], "--json: the folder of no-such-folder/x.json does "
                                          "not exist"),
    (["--plot", "no-such-folder/x.png"], "--plot: the folder of no-such-folder/x.png does "
                                         "not exist"),
], ids=["mode", "no_mode", "tokens", "no_strategies", "heads", "head_dim", "json", "plot"])
def test_bad_arguments_are_usage_errors(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_:
        bench.parse_args(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_a_dtype_is_taken_as_checked():
    """The name the check read (spaces and empty items dropped) is the one a run uses:
    " bfloat16," passed the check and then failed the run."""
    assert bench.parse_args(["--dtype", " bfloat16,"]).dtype == "bfloat16"
    assert bench.parse_args(["--kernels", "--dtype", "float16, float32"]).dtype == \
        "float16,float32"


def test_a_script_names_itself_in_the_help(capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--help"], prog="python -m mpi4py benchmarks/bare_push.py")
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m mpi4py benchmarks/bare_push.py") and \
        "--startup" not in out, out


def test_the_kernel_bench_without_a_gpu_says_so():
    from gpu import gpu_count

    if gpu_count() > 0:
        pytest.skip("checks the message given where there is no GPU")
    with pytest.raises(SystemExit, match=r"^python -m cupy_dcp.bench --kernels needs CuPy and a "
                                         r"CUDA GPU"):
        bench.main(["--kernels", "--tokens", "1", "--no-direct"])


def test_the_table_and_plot_take_records_without_a_floor(tmp_path, capsys):
    """Without raw_alltoall there is no floor: the JSON says null (not NaN, which JSON
    lacks), the table a dash; nothing timed, no plot (not an IndexError)."""
    record = dict(tokens=1, mode="eager", strategy="ag_rs", median_us=5.0, p90_us=6.0,
                  ratio_to_floor=None)
    assert bench._table([record]).splitlines()[1].split()[-1] == "-"
    bench._plot([], str(tmp_path / "p.png"))
    assert "nothing was timed" in capsys.readouterr().out and not (tmp_path / "p.png").exists()


@pytest.mark.parametrize("text, cell", [
    ("bfloat16,2,512,64,128", ("bfloat16", 2, 512, 64, 128)),
    ("float32,8,1,32,1", ("float32", 8, 1, 32, 1)),
])
def test_kernel_shapes_takes_a_cell_from_the_command_line(text, cell):
    from benchmarks import kernel_shapes

    assert kernel_shapes._cell(text) == cell


@pytest.mark.parametrize("text", ["bfloat16,2,512", "bfloat16,2,512,64,x", "bfloat16,3,1,64,128",
                                  "float32,2,0,64,128", "int8,2,1,64,128"])
def test_kernel_shapes_refuses_a_malformed_cell(text):
    import argparse

    from benchmarks import kernel_shapes

    with pytest.raises(argparse.ArgumentTypeError, match="DTYPE|N dividing H"):
        kernel_shapes._cell(text)


def test_a_run_that_fails_part_way_keeps_what_it_timed(tmp_path, monkeypatch, capsys):
    """The host bench's second token count fails: the first one's records are in
    ``--json`` + ``.partial``, ``--json`` itself is not written, and the error stands."""
    timed = []

    def host_time(fn, reps, calls, world):
        if len(timed) == 2:  # B = 1's two strategies are timed, then B = 2's first fails
            raise RuntimeError("a peer went away")
        timed.append(fn)
        return 10.0, 12.0

    monkeypatch.setattr(bench, "_host_time", host_time)
    path = tmp_path / "run.json"
    args = bench.parse_args(["--device", "cpu", "--tokens", "1,2", "--heads", "4",
                             "--head-dim", "8", "--strategies", "raw_alltoall,cupy_dcp_a2a",
                             "--json", str(path)])
    with pytest.raises(RuntimeError, match="a peer went away"):
        bench.run(args)
    assert not path.exists()
    import json
    kept = json.loads((tmp_path / "run.json.partial").read_text())
    assert [(r["tokens"], r["strategy"]) for r in kept] == [(1, "raw_alltoall"),
                                                            (1, "cupy_dcp_a2a")]
    assert "the 2 records it had are in" in capsys.readouterr().err
