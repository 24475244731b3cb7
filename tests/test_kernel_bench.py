"""The kernel bench's options, rows, table and JSON (``cupy_dcp._kernel_table``), and
the floor kernels' buffer sizes: pure functions, no GPU."""

import json

import pytest

from cupy_dcp._floors import MAX_IN_FLIGHT, copy_kernel, in_flight, quad_words
from cupy_dcp._kernel_table import (KERNELS, SHAPES, check_kernel_args, dtype_list,
                                    kernel_cases, kernel_row, kernel_table, parse_shapes,
                                    write_rows)
from cupy_dcp.bench import parse_args


def test_kernel_options_default_to_the_issue_table():
    args = parse_args(["--kernels"])
    assert args.world_size == [2]
    assert args.shapes == [(128, 512), (32, 128), (64, 128)] == list(SHAPES)
    assert args.tokens == [1, 8, 32, 128, 512, 2048]
    assert dtype_list(args.dtype) == ["bfloat16"]
    assert not args.no_direct
    assert args.only == list(KERNELS)


def test_kernel_options_parse_lists():
    args = parse_args(["--kernels", "--world-size", "2,4,8", "--dtype", "bfloat16,float16,float32",
                       "--shapes", "32x128,64X128", "--tokens", "1,32", "--no-direct",
                       "--json", "rows.json", "--reps", "15",
                       "--only", "combine,pack_masked"])
    assert args.world_size == [2, 4, 8]
    assert dtype_list(args.dtype) == ["bfloat16", "float16", "float32"]
    assert args.shapes == [(32, 128), (64, 128)]
    assert args.tokens == [1, 32] and args.no_direct and args.json_path == "rows.json"
    assert args.reps == 15 and args.only == ["combine", "pack_masked"]


@pytest.mark.parametrize("argv, message", [
    (["--kernels", "--dtype", "bfloat16,int8"], "dtype must be a comma list"),
    (["--dtype", "bfloat16,float32"], "dtype must be one name without --kernels"),
    (["--kernels", "--world-size", "3"], "must divide by every N"),
    (["--kernels", "--world-size", "0"], "world-size must be a comma list of N >= 1"),
    (["--kernels", "--shapes", "128"], "shapes must be a comma list of HxD"),
    (["--kernels", "--calls", "0"], "calls and reps must be >= 1"),
    (["--kernels", "--only", "combine,unpack"], "only must be a comma list of pack, pack_masked"),
])
def test_bad_kernel_options_exit_with_the_reason(argv, message, capsys):
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert message in capsys.readouterr().err


def test_plain_run_leaves_the_kernel_bench_sizes_alone():
    """A plain run takes N from the MPI world: ``--world-size`` and ``--shapes`` are the
    kernel bench's, and a value they could not time there is no error here."""
    args = parse_args(["--world-size", "3"])
    assert args.world_size == [3] and not args.kernels


def test_check_kernel_args_names_the_argument():
    args = parse_args(["--kernels"])
    args.world_size = [2, 3]
    with pytest.raises(ValueError, match=r"every H of --shapes must divide by every N "
                                         r"of --world-size \(got N=3, H=128\)"):
        check_kernel_args(args)
    with pytest.raises(ValueError, match=r"dtype must be a comma list .* \(got ''\)"):
        dtype_list("")
    with pytest.raises(ValueError, match=r"shapes must be a comma list of HxD.*\(got '0x5'\)"):
        parse_shapes("0x5")


def test_cases_in_table_order():
    cases = kernel_cases(["bfloat16", "float32"], [2, 8], [(128, 512), (32, 128)], [1, 32])
    assert len(cases) == 2 * 2 * 2 * 2
    assert cases[0] == ("bfloat16", 2, 1, 128, 512)
    assert cases[1] == ("bfloat16", 2, 32, 128, 512)
    assert cases[2] == ("bfloat16", 2, 1, 32, 128)
    assert cases[4] == ("bfloat16", 8, 1, 128, 512)
    assert cases[-1] == ("float32", 8, 32, 32, 128)


def test_row_sets_the_kernel_beside_its_floors():
    row = kernel_row(("bfloat16", 2, 32, 128, 512), "combine", 4.0, 2.5, 3.2,
                     6_000_000, 2_000_000, 4000.0, (64,), (32, 4), host_us=None)
    assert row["us"] == 4.0 and row["empty_us"] == 2.5 and row["copy_us"] == 3.2
    assert row["x_empty"] == 1.6 and row["x_copy"] == 1.25 and row["over_empty_us"] == 1.5
    assert row["gbs"] == 2000.0  # 8 MB in 4 us
    assert row["copy_gbs"] == 2500.0
    assert row["pct_device_copy"] == 50.0
    assert (row["dtype"], row["world_size"], row["tokens"], row["heads"], row["head_dim"]) == \
        ("bfloat16", 2, 32, 128, 512)
    assert row["grid"] == [64] and row["block"] == [32, 4] and row["host_us"] is None
    json.dumps(row)  # every field is JSON


def _rows():
    rows = []
    for B in (1, 8):
        for i, k in enumerate(KERNELS):
            rows.append(kernel_row(("float16", 4, B, 32, 128), k, 3.0 + i, 2.0, 2.5, 4096,
                                   4096, 3000.0, (1,), (32, 4), 12.5 if k == "pack" else None))
    return rows


def test_table_has_a_line_per_case_and_a_cell_per_kernel():
    lines = kernel_table(_rows()).splitlines()
    assert len(lines) == 3
    assert all(k in lines[0] for k in KERNELS)
    first = lines[1].split()
    assert first[:6] == ["float16", "4", "1", "32", "128", "2.00"]
    assert "3.00 ( +1.00, x 1.20)" in lines[1]  # pack: 3 us, 1 over the empty, 3 / 2.5
    assert "7.00 ( +5.00, x 2.80)" in lines[2]  # agrs_finish: 7 us, 2 over the empty, 7 / 2.5


def test_json_holds_every_row_and_the_meta(tmp_path):
    rows = _rows()
    path = tmp_path / "kernels.json"
    write_rows(path, rows, {"device": "H200", "calls": 20})
    back = json.loads(path.read_text())
    assert back["meta"] == {"device": "H200", "calls": 20}
    assert back["rows"] == rows and len(back["rows"]) == 2 * len(KERNELS)


@pytest.mark.parametrize("nbytes, words", [(0, 4), (1, 4), (16, 4), (17, 8), (4096, 1024)])
def test_floor_buffers_are_whole_quads(nbytes, words):
    assert quad_words(nbytes) == words


@pytest.mark.parametrize("read, written, quads", [
    (4096, 4096, 1),  # a pack: as many bytes read as written, a plain copy
    (100, 4096, 1),  # reads fewer
    (2 * 4096 + 16, 4096, 4),  # a combine of N = 2 with its LSE lanes: 3 quads a quad
    (2 * 4096, 4096, 2), (8 * 4096, 4096, 8), (64 * 4096, 4096, MAX_IN_FLIGHT)])
def test_copy_floor_asks_for_a_combines_n_rows_at_once(read, written, quads):
    assert in_flight(read, written) == quads


def test_copy_floor_refuses_other_counts():
    with pytest.raises(ValueError, match="quads_in_flight"):
        copy_kernel(3)


def test_kernel_targets_reads_the_issue_targets_off_the_json(tmp_path):
    """``benchmarks/kernel_targets.py``: issue 27's table against vLLM's figures, and
    each target's cells split by whether the copy floor itself meets it."""
    from benchmarks import kernel_targets as kt

    def row(case, kernel, us, empty, copy, nbytes=10**6):
        return kernel_row(case, kernel, us, empty, copy, nbytes, nbytes, 2000.0, (1,), (32,))

    first = ("bfloat16", 2, 1, 128, 512)  # vLLM: pack 2.03, combine 1.55
    big = ("bfloat16", 2, 512, 64, 128)
    rows = [row(first, "pack", 1.40, 0.72, 1.62), row(first, "combine", 1.60, 0.72, 1.34),
            row(("float32", 4, 8, 32, 128), "combine", 1.50, 0.70, 1.30),  # over; copy within
            row(("float32", 4, 32, 32, 128), "combine", 2.00, 0.70, 1.50),  # both over
            row(big, "pack", 1.00, 0.50, 0.90),  # 2 MB in 1 us: 100 % of 2000 GB/s
            row(big, "combine", 1.25, 0.50, 1.10),  # 80 %, its copy 90.9 %
            row(("float16", 2, 2048, 64, 128), "combine", 1.25, 0.50, 1.20),  # 80 %, 83.3 %
            row(first, "pack_masked", 1.95, 0.72, 1.70)]
    path = tmp_path / "k.json"
    write_rows(path, rows, dict(memcpy_gbs=1500.0, vector_copy_gbs=2000.0))
    got, rates = kt.load([path])
    lines, at_or_below, entries = kt.vllm_lines(got)
    assert (at_or_below, entries) == (1, 2)  # the combine's 1.60 is over vLLM's 1.55
    assert "1.60*" in lines[1] and "cells not in the rows" in lines[-1]
    cells, within, gap, floor = kt.near_empty(got, "combine")
    assert (cells, within, [r["tokens"] for r in gap], floor) == (3, 0, [1, 8], 1)
    assert kt.near_empty(got, "pack")[:2] == (1, 1)
    cells, reach, gap, floor = kt.copy_rate(got, rates, "combine")
    assert (cells, reach, [r["tokens"] for r in gap], floor) == (2, 0, [512], 1)
    assert kt.copy_rate(got, rates, "pack")[:2] == (1, 1)
    assert kt.mask_costs(got) == pytest.approx([0.55])
    text = "\n".join(kt.report(got, rates, verbose=True))
    assert "over 0.5 us in 1 of 1 cells" in text and "float32 N=4 B=8 32x128" in text


def test_kernel_targets_counts_as_the_bench_rounds_and_each_run_its_rate(tmp_path):
    """A kernel 0.700 us over the empty kernel is within 0.7 (1.403 - 0.703 is not
    0.7 in floats), and in a file of several runs each row's copy share is of its own
    run's rate (``device_copy_gbs``), not of the first run's ``meta``."""
    from benchmarks import kernel_targets as kt

    def row(case, kernel, us, empty, copy, rate=None):
        got = kernel_row(case, kernel, us, empty, copy, 10**6, 10**6, rate or 2000.0, (1,),
                         (32,))
        if rate is not None:
            got["device_copy_gbs"] = rate
        return got

    exact = ("bfloat16", 2, 8, 64, 128)
    assert 1.403 - 0.703 > 0.7
    big = ("float16", 8, 512, 32, 128)
    rows = [row(exact, "combine", 1.403, 0.703, 1.30),
            # 2 MB: the copy's 1.175 us is 85.1 % of 2000 GB/s but 84.9 % of 2005
            row(big, "combine", 1.50, 0.50, 1.175, rate=2005.0)]
    path = tmp_path / "k.json"
    write_rows(path, rows, dict(memcpy_gbs=1500.0, vector_copy_gbs=2000.0))
    got, rates = kt.load([path])
    assert kt.near_empty(got, "combine")[:2] == (1, 1)
    assert rates[kt.cell_of(rows[1]), "combine"] == 2005.0
    cells, reach, gap, floor = kt.copy_rate(got, rates, "combine")
    assert (cells, reach, gap, floor) == (1, 0, [], 1)
    with open(tmp_path / "other.json", "w") as f:
        f.write("[]")
    with pytest.raises(SystemExit, match="not the kernel bench's JSON"):
        kt.load([tmp_path / "other.json"])
