"""The kernel bench's cases, rows and output, as pure functions (no GPU needed).

A case is one ``(dtype, N, B, H, D)``; each kernel timed in it gives a row (a
dict, the JSON record) with its time beside the launch floor (the empty kernel)
and the copy floor (a copy of the same bytes in the same grid):

``dtype, world_size, tokens, heads, head_dim, kernel, us, empty_us, copy_us,
x_empty, x_copy, over_empty_us, bytes_read, bytes_written, gbs, copy_gbs,
pct_device_copy, grid, block, host_us``.
"""

import argparse
import json
import os

DTYPES = ("bfloat16", "float16", "float32")
SHAPES = ((128, 512), (32, 128), (64, 128))  # (H, D) of the table
KERNELS = ("pack", "pack_masked", "combine", "agrs_correct", "agrs_finish")

__all__ = ["DTYPES", "KERNELS", "SHAPES", "add_kernel_args", "check_kernel_args",
           "check_output_path", "dtype_list",
           "kernel_cases", "kernel_list", "kernel_row", "kernel_table", "parse_shapes",
           "write_rows"]


def _names(text, allowed, label):
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in names if t not in allowed]
    if not names or bad:
        raise ValueError(f"{label} must be a comma list of {', '.join(allowed)} (got {text!r})")
    return names


def dtype_list(text):
    """``"bfloat16,float32"`` as ``["bfloat16", "float32"]``, each one of :data:`DTYPES`.

    Raises:
        ValueError: an empty list, or a name not in :data:`DTYPES`.
    """
    return _names(text, DTYPES, "dtype")


def kernel_list(text):
    """``"pack,combine"`` as ``["pack", "combine"]``, each one of :data:`KERNELS`.

    Raises:
        ValueError: an empty list, or a name not in :data:`KERNELS`.
    """
    return _names(text, KERNELS, "only")


def parse_shapes(text):
    """``"128x512,32x128"`` as ``[(128, 512), (32, 128)]``: (H, D) pairs, both >= 1.

    Raises:
        ValueError: a shape not written ``HxD`` with positive integers.
    """
    shapes = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        parts = item.lower().split("x")
        if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise ValueError(f"shapes must be a comma list of HxD, e.g. 128x512 (got {item!r})")
        shapes.append((int(parts[0]), int(parts[1])))
    if not shapes:
        raise ValueError(f"shapes must name at least one HxD (got {text!r})")
    return shapes


def _option(parse):
    """``parse`` as an argparse type: its ValueError's message becomes the usage error."""
    def parsed(text):
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parsed


def add_kernel_args(parser):
    """The ``--kernels`` options on ``parser`` (an :class:`argparse.ArgumentParser`)."""
    ints = lambda s: [int(v) for v in s.split(",") if v]  # noqa: E731
    parser.add_argument("--world-size", type=ints, default=[2], metavar="N,...",
                        help="--kernels: the ranks N whose buffers [N, B, H/N, D+P] are timed")
    parser.add_argument("--shapes", type=_option(parse_shapes), default=list(SHAPES),
                        metavar="HxD,...",
                        help="--kernels: the (H, D) shapes (default: the issue's table)")
    parser.add_argument("--only", type=_option(kernel_list), default=list(KERNELS),
                        metavar="KERNEL,...", help=f"--kernels: time only these, of "
                                                   f"{', '.join(KERNELS)}")
    parser.add_argument("--no-direct", action="store_true",
                        help="--kernels: skip the direct path's kernel (the slow part)")


def check_kernel_args(args):
    """Validate the ``--kernels`` options of parsed ``args``; raise ``ValueError``
    naming the first that is wrong. Without ``--kernels`` one dtype only, and
    ``--world-size`` and ``--shapes``, which only ``--kernels`` reads, are not checked."""
    names = dtype_list(args.dtype)
    if not args.kernels and len(names) != 1:
        raise ValueError(f"dtype must be one name without --kernels (got {args.dtype!r})")
    args.dtype = ",".join(names)  # as checked: " bfloat16," is bfloat16
    if args.heads < 1 or args.head_dim < 1:
        raise ValueError(f"heads and head-dim must be >= 1 (got {args.heads} and "
                         f"{args.head_dim})")
    if args.kernels:  # (a plain run's N is the MPI world's; it reads neither option)
        if not args.world_size or any(n < 1 for n in args.world_size):
            raise ValueError(f"world-size must be a comma list of N >= 1 (got "
                             f"{args.world_size})")
        bad = [(n, h) for n in args.world_size for h, _ in args.shapes if h % n]
        if bad:
            raise ValueError(f"every H of --shapes must divide by every N of --world-size "
                             f"(got N={bad[0][0]}, H={bad[0][1]})")
    if not args.tokens or any(b < 1 for b in args.tokens):
        raise ValueError(f"tokens must be a comma list of B >= 1 (got {args.tokens})")
    if args.calls < 1 or args.reps < 1:
        raise ValueError(f"calls and reps must be >= 1 (got {args.calls} and {args.reps})")


def check_output_path(path, option):
    """``ValueError`` where ``path`` (an output file, ``None`` for none) is in a folder
    that does not exist: said before the timing, not after it."""
    if path is None:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ValueError(f"{option}: the folder of {path} does not exist")


def kernel_cases(dtypes, world_sizes, shapes, tokens):
    """Every ``(dtype, N, B, H, D)`` case, in table order (dtype, N, shape, B)."""
    return [(dtype, n, B, H, D) for dtype in dtypes for n in world_sizes for H, D in shapes
            for B in tokens]


def kernel_row(case, kernel, us, empty_us, copy_us, bytes_read, bytes_written, device_copy_gbs,
               grid, block, host_us=None):
    """One row: a kernel's median µs in ``case`` beside its floors, as ratios and GB/s.

    ``device_copy_gbs`` is the GPU's copy bandwidth (read + write, measured once);
    ``pct_device_copy`` is the kernel's GB/s as a percent of it.
    """
    dtype, n, B, H, D = case
    moved = bytes_read + bytes_written
    gbs = moved / us / 1e3
    return dict(dtype=dtype, world_size=n, tokens=B, heads=H, head_dim=D, kernel=kernel,
                us=round(us, 3), empty_us=round(empty_us, 3), copy_us=round(copy_us, 3),
                x_empty=round(us / empty_us, 3), x_copy=round(us / copy_us, 3),
                over_empty_us=round(us - empty_us, 3), bytes_read=int(bytes_read),
                bytes_written=int(bytes_written), gbs=round(gbs, 1),
                copy_gbs=round(moved / copy_us / 1e3, 1),
                pct_device_copy=round(100 * gbs / device_copy_gbs, 1),
                device_copy_gbs=round(device_copy_gbs, 1),  # (what the percent is of)
                grid=list(grid), block=list(block),
                host_us=None if host_us is None else round(host_us, 2))


def kernel_table(rows):
    """The printed table: a line per case, and per kernel ``us (+µs over the empty
    kernel, x the copy floor)``; the case's empty-kernel time leads the line."""
    names = [k for k in KERNELS if any(r["kernel"] == k for r in rows)]
    head = f"{'dtype':>8} {'N':>2} {'B':>5} {'H':>4} {'D':>4} {'empty':>6} " + " ".join(
        f"{k + ' us (+e, xc)':>26}" for k in names)
    lines = [head]
    cases = {}
    for r in rows:
        cases.setdefault((r["dtype"], r["world_size"], r["tokens"], r["heads"], r["head_dim"]),
                         {})[r["kernel"]] = r
    for (dtype, n, B, H, D), by_kernel in cases.items():
        empty = by_kernel[next(iter(by_kernel))]["empty_us"]
        cells = []
        for k in names:
            r = by_kernel.get(k)
            cells.append(f"{'-':>26}" if r is None else
                         f"{r['us']:>9.2f} ({r['over_empty_us']:+6.2f}, x{r['x_copy']:5.2f})")
        lines.append(f"{dtype:>8} {n:>2} {B:>5} {H:>4} {D:>4} {empty:>6.2f} " + " ".join(cells))
    return "\n".join(lines)


def write_rows(path, rows, meta):
    """Write ``{"meta": meta, "rows": rows}`` as JSON to ``path``."""
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
        f.write("\n")
