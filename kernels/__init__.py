"""Kernels of cupy_dcp (installed as ``cupy_dcp.kernels``).

``pack_send`` and ``unpack_combine`` are Numba CUDA kernels for device arrays;
``pack_host`` and ``combine_host`` are their Numba ``njit`` twins for NumPy
arrays. Both share the row math of ``_math``. Nothing here knows about
communicators. Every kernel is compiled lazily, on first use (or loaded from
the kernel cache, ``_cache``), so importing needs no GPU.
"""

import importlib

_HOMES = {"agrs_correct": "agrs", "agrs_finish": "agrs", "unpack_combine": "combine",
          "agrs_correct_host": "host", "agrs_lse_host": "host", "combine_host": "host",
          "mask_lse_host": "host", "pack_host": "host", "pack_send": "pack"}

__all__ = ["agrs_correct", "agrs_correct_host", "agrs_finish", "agrs_lse_host", "combine_host", "mask_lse_host", "pack_host",
           "pack_send", "unpack_combine"]


def __getattr__(name):
    """Each kernel imported with its module on first use: importing this package
    loads no Numba (a host path never imports the CUDA target)."""
    home = _HOMES.get(name)
    if home is None:  # a submodule, as ``import`` would have bound it
        try:
            return importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value
    return value
