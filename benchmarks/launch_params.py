"""What a launch's parameter block costs: host microseconds per ready launch and GPU
microseconds per launch in a CUDA graph, for an empty kernel of 2 and of 12 array
arguments (14 and 84 64-bit parameters: the floors' block, and more than the combine's
76), through the driver and cuda.core launchers.

    python benchmarks/launch_params.py

One GPU. Host time: the median of 5 loops of 3000 ready launches (no synchronisation
inside a loop). GPU time: a graph of 20 launches, the median of 15 replays.
"""

import time

import numpy as np


def _host_us(launch, stream, count=3000, loops=5):
    launch()
    stream.synchronize()
    samples = []
    for _ in range(loops):
        t0 = time.perf_counter()
        for _ in range(count):
            launch()
        samples.append((time.perf_counter() - t0) / count * 1e6)
        stream.synchronize()
    return float(np.median(samples))


def main():
    import cupy
    from numba import cuda

    from cupy_dcp._kernel_bench import _graph_us
    from cupy_dcp.kernels._arrays import kernel_array
    from cupy_dcp.kernels._launch import SpecializedKernel, array_type

    @cuda.jit
    def empty2(a, b):
        pass

    @cuda.jit
    def empty12(a, b, c, d, e, f, g, h, i, j, k, m):
        pass

    stream = cupy.cuda.Stream(non_blocking=True)
    words = kernel_array(cupy.zeros(4, cupy.uint32), np.uint32)
    word_type = array_type(np.uint32, 1, True)
    print("empty kernels: host us per ready launch, GPU us per launch in a graph", flush=True)
    for name, dispatcher, count in (("2 arrays", empty2, 2), ("12 arrays", empty12, 12)):
        for launcher in ("driver", "core"):
            kernel = SpecializedKernel(dispatcher, (word_type,) * count, launcher=launcher)
            for grid in ((1,), (64, 2)):
                ready = kernel.prepare(grid, (32, 4), (words,) * count)
                host = _host_us(lambda: ready(stream.ptr), stream)
                gpu = _graph_us(cupy, stream, lambda: ready(stream.ptr), 20, 15)
                print(f"  {name:<9} {launcher:<6} grid {str(grid):<8} host {host:5.2f}  "
                      f"GPU {gpu:.3f}", flush=True)


if __name__ == "__main__":
    main()
