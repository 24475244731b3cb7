"""Issue 27's targets, read off the kernel bench's JSON (no GPU needed).

    python benchmarks/kernel_targets.py results/h200_kernels_final.json [more.json ...]

``python -m cupy_dcp.bench --kernels --json FILE`` times each kernel beside two
floors in the same run and grid: the empty kernel (the launch floor) and a copy
of the same bytes in 16-byte quads (the copy floor). This prints, from one or
more such files (their rows merged; a later file's row replaces an earlier
one's of the same cell and kernel):

- issue 27's table: the pack and the combine beside vLLM's figures from the
  issue (:data:`VLLM`) and beside both floors;
- each kernel's cells at ``B <= 32`` within 0.7 us of the empty kernel, and of
  those that are not, how many have a copy floor that is itself over 0.7 us
  (a bound below what a copy of the same bytes in that grid does);
- each kernel's cells at ``B >= 512`` at 85 % of the 16-byte copy rate or more,
  and of those that are not, how many have a copy floor under 85 % too;
- what a ``seq_lens`` mask costs the pack at ``B <= 32`` (the bound is 0.5 us).

A cell the files lack is named, not skipped silently.
"""

import argparse
import json
import statistics

# Issue 27's table: vLLM's Triton kernels on one H200, CUDA-graph replay of 20
# calls; (dtype, N, B, H, D): (pack us, combine us).
VLLM = {
    ("bfloat16", 2, 1, 128, 512): (2.03, 1.55),
    ("bfloat16", 2, 8, 128, 512): (2.33, 1.96),
    ("bfloat16", 2, 32, 128, 512): (3.72, 2.96),
    ("bfloat16", 2, 128, 128, 512): (9.43, 7.36),
    ("bfloat16", 2, 512, 128, 512): (44.4, 34.6),
    ("bfloat16", 2, 2048, 128, 512): (172.0, 133.0),
    ("bfloat16", 2, 1, 32, 128): (1.87, 1.54),
    ("bfloat16", 2, 32, 32, 128): (2.07, 1.88),
    ("bfloat16", 2, 2048, 64, 128): (47.9, 42.2),
    ("bfloat16", 4, 1, 128, 512): (2.63, 1.70),
    ("bfloat16", 4, 128, 128, 512): (9.48, 6.08),
    ("bfloat16", 8, 1, 128, 512): (4.19, 2.56),
    ("bfloat16", 8, 32, 128, 512): (4.76, 3.20),
    ("bfloat16", 8, 128, 128, 512): (9.69, 6.16),
    ("bfloat16", 8, 32, 32, 128): (3.32, 1.92),
    ("bfloat16", 8, 256, 64, 128): (4.81, 4.55),
    ("float16", 8, 32, 128, 512): (4.76, 3.20),
    ("float32", 2, 32, 128, 512): (4.40, 3.19),
    ("float32", 8, 32, 128, 512): (5.45, 3.52),
}
NEAR_EMPTY_US = 0.7  # "within 0.7 us of the empty-kernel floor at B <= 32"
SMALL_TOKENS = 32
COPY_PCT = 85.0  # ">= 85 % of copy bandwidth at B >= 512"
LARGE_TOKENS = 512
MASK_US = 0.5  # "a mask must cost less than 0.5 us more than no mask"
KERNELS = ("pack", "pack_masked", "combine", "agrs_correct", "agrs_finish")


def cell_of(row):
    return row["dtype"], row["world_size"], row["tokens"], row["heads"], row["head_dim"]


def load(paths):
    """``(rows, device copy GB/s of each row)`` of the kernel bench's JSON files
    ``paths``, keyed ``(cell, kernel)``. A row's rate is what its
    ``pct_device_copy`` is of: its own ``device_copy_gbs`` where it has one (a file
    that merges several runs, one a dtype, say, gives each row its run's), else the
    larger of its file's ``memcpy_gbs`` and ``vector_copy_gbs``."""
    rows, rates = {}, {}
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
            raise SystemExit(f"{path}: not the kernel bench's JSON (no 'rows' list)")
        rate = max(data["meta"]["memcpy_gbs"], data["meta"]["vector_copy_gbs"])
        for row in data["rows"]:
            key = cell_of(row), row["kernel"]
            rows[key], rates[key] = row, row.get("device_copy_gbs", rate)
    return rows, rates


def over(us, floor_us):
    """``us - floor_us`` as the bench rounds its figures (to the ns): 1.403 - 0.703
    is 0.7, not 0.7000000000000001."""
    return round(us - floor_us, 3)




def vllm_lines(rows):
    """Issue 27's table, ours beside vLLM's and the floors; and how many of its entries
    are at or below vLLM's figure, of how many the rows hold."""
    lines = [f"{'dtype':>8} {'N':>2} {'B':>5} {'HxD':>8} {'empty':>6} | "
             f"{'pack':>7} {'(copy)':>8} {'vLLM':>7} | {'combine':>7} {'(copy)':>8} {'vLLM':>7}"]
    at_or_below = entries = 0
    missing = []
    for cell, theirs in VLLM.items():
        ours = [rows.get((cell, k)) for k in ("pack", "combine")]
        if None in ours:
            missing.append(cell)
            continue
        parts = []
        for row, them in zip(ours, theirs):
            entries += 1
            at_or_below += row["us"] <= them
            mark = " " if row["us"] <= them else "*"
            parts.append(f"{row['us']:>6.2f}{mark} ({row['copy_us']:>6.2f}) {them:>7.2f}")
        dtype, n, B, H, D = cell
        lines.append(f"{dtype:>8} {n:>2} {B:>5} {f'{H}x{D}':>8} {ours[0]['empty_us']:>6.2f} | "
                     + " | ".join(parts))
    lines.append(f"at or below vLLM's figure: {at_or_below} of {entries} entries "
                 f"(* marks the others)" + (f"; cells not in the rows: {missing}" if missing
                                            else ""))
    return lines, at_or_below, entries


def near_empty(rows, kernel):
    """``(cells, within, over where the copy floor is within, over with the copy
    floor over too)`` of ``kernel`` at ``B <= 32``."""
    cells = [r for (cell, k), r in rows.items() if k == kernel and cell[2] <= SMALL_TOKENS]
    within = [r for r in cells if over(r["us"], r["empty_us"]) <= NEAR_EMPTY_US]
    beyond = [r for r in cells if over(r["us"], r["empty_us"]) > NEAR_EMPTY_US]
    copy_within = [r for r in beyond if over(r["copy_us"], r["empty_us"]) <= NEAR_EMPTY_US]
    return len(cells), len(within), copy_within, len(beyond) - len(copy_within)


def copy_rate(rows, rates, kernel):
    """``(cells, reaching 85 %, under where the copy floor reaches it, under with
    the copy floor under too)`` of ``kernel`` at ``B >= 512``."""
    cells = [(r, rates[key]) for key, r in rows.items()
             if key[1] == kernel and key[0][2] >= LARGE_TOKENS]
    reach = [r for r, _ in cells if r["pct_device_copy"] >= COPY_PCT]
    under = [(r, rate) for r, rate in cells if r["pct_device_copy"] < COPY_PCT]
    copy_reaches = [r for r, rate in under if 100 * r["copy_gbs"] / rate >= COPY_PCT]
    return len(cells), len(reach), copy_reaches, len(under) - len(copy_reaches)


def mask_costs(rows):
    """The masked pack's time over the pack's, in us, of each cell at ``B <= 32``."""
    return [rows[(cell, "pack_masked")]["us"] - r["us"] for (cell, k), r in rows.items()
            if k == "pack" and cell[2] <= SMALL_TOKENS and (cell, "pack_masked") in rows]


def _named(row):
    dtype, n, B, H, D = cell_of(row)
    return f"{dtype} N={n} B={B} {H}x{D}"


def report(rows, rates, verbose=False):
    """The lines this script prints."""
    lines, _, _ = vllm_lines(rows)
    lines += ["", f"B <= {SMALL_TOKENS}, within {NEAR_EMPTY_US} us of the empty kernel: "
              f"cells, within; over, where the copy floor is within; over, the copy floor "
              f"over too"]
    for kernel in KERNELS:
        cells, within, gap, floor = near_empty(rows, kernel)
        if cells:
            lines.append(f"  {kernel:<13} {cells:>4} {within:>4}   {len(gap):>4} {floor:>4}")
            if verbose:
                lines += [f"      {_named(r)}: {r['us']:.2f} us, empty {r['empty_us']:.2f}, "
                          f"copy {r['copy_us']:.2f}" for r in gap]
    lines += ["", f"B >= {LARGE_TOKENS}, {COPY_PCT:g} % of the 16-byte copy rate: cells, "
              f"reaching it; under, where the copy floor reaches it; under, the copy floor "
              f"under too"]
    for kernel in KERNELS:
        cells, reach, gap, floor = copy_rate(rows, rates, kernel)
        if cells:
            lines.append(f"  {kernel:<13} {cells:>4} {reach:>4}   {len(gap):>4} {floor:>4}")
            if verbose:
                lines += [f"      {_named(r)}: {r['pct_device_copy']:.1f} %, x{r['x_copy']:.2f} "
                          f"the copy floor" for r in gap]
    costs = mask_costs(rows)
    if costs:
        lines += ["", f"a mask at B <= {SMALL_TOKENS}: median {statistics.median(costs):.2f} us, "
                  f"at most {max(costs):.2f}; over {MASK_US} us in "
                  f"{sum(c > MASK_US for c in costs)} of {len(costs)} cells"]
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", nargs="+", help="the kernel bench's --json files")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="name the cells under a target whose floor reaches it")
    args = parser.parse_args(argv)
    rows, rates = load(args.json)
    print("\n".join(report(rows, rates, args.verbose)))


if __name__ == "__main__":
    main()
