"""The switches' defaults from the environment: the one module of cupy_dcp that reads it.

Every switch is an argument. A variable below only supplies the default of an
argument left ``None``; it is read when that argument is resolved (as a plan is
built), so a bad value fails the plan's construction, on every rank.

``CUPY_DCP_PDL`` (``0`` or ``1``)
    The default of ``DcpDirectPlan(pdl=None)``: ``0`` is ``pdl=False`` (ordinary
    launches); ``1`` or unset, programmatic dependent launches where every rank's
    GPU supports them.
``CUPY_DCP_LINES`` (``0`` or ``1``)
    The default of ``DcpDirectPlan(protocols=None)``: ``0`` leaves out
    ``"lines"``; ``1`` or unset, every protocol.
``CUPY_DCP_LAUNCHER`` (``core``, ``driver``, ``cupy`` or ``numba``)
    The process's kernel launcher, chosen once, as the first plan (or the
    kernel bench) is built: ``cupy_dcp.kernels._launch.choose_launcher``, which
    code that uses the kernels alone calls itself. Unset or empty, the first
    launcher that runs here.

``CUPY_DCP_CACHE_DIR`` (a folder) and ``CUPY_DCP_CACHE`` (``0`` turns it off)
    Where compiled kernels are kept across processes
    (:func:`kernel_cache_dir`; ``cupy_dcp.kernels._cache``): unset, a per-user
    folder; empty, or ``CUPY_DCP_CACHE=0``, no cache.

The plans agree on the resolved values across ranks: a rank whose environment
resolves differently makes every rank raise ``ValueError``.
"""

import os

import numpy as np

__all__ = ["PROTOCOLS", "kernel_cache_dir", "launcher", "pdl", "protocols",
           "spawn_environment"]

PROTOCOLS = ("tiles", "words", "lines")  # a direct call's transfer, by size: the order here


def _flag(env, name):
    """The variable ``name`` as ``True`` (``1``), ``False`` (``0``) or ``None`` (unset)."""
    setting = env.get(name)
    if setting is None:
        return None
    if setting not in ("0", "1"):
        raise ValueError(f"{name} must be 0 or 1 (got {setting!r})")
    return setting == "1"


def pdl(value=None, env=os.environ):
    """The direct plan's ``pdl`` argument resolved: ``True`` (launch every call as a
    programmatic dependent; the plan raises where the GPUs cannot), ``False`` (never)
    or ``None`` (where every rank's GPU supports it). ``None`` takes
    ``CUPY_DCP_PDL=0`` as ``False``."""
    if value is not None:
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"pdl must be True, False or None (got {value!r})")
        return bool(value)
    return None if _flag(env, "CUPY_DCP_PDL") is not False else False


def protocols(value=None, env=os.environ):
    """The direct plan's ``protocols`` argument resolved: the names of
    :data:`PROTOCOLS` that its calls may use, as a tuple in that order. ``"tiles"``
    must be one (a call too large for the others goes in tiles). ``None`` is every
    protocol, less ``"lines"`` under ``CUPY_DCP_LINES=0``."""
    if value is None:
        lines = _flag(env, "CUPY_DCP_LINES")
        return PROTOCOLS if lines is not False else PROTOCOLS[:2]
    if isinstance(value, str) or not hasattr(value, "__iter__"):
        raise TypeError(f"protocols must be a collection of protocol names such as "
                        f"('tiles', 'words') (got {value!r})")
    names = list(value)
    unknown = [name for name in names if name not in PROTOCOLS]
    if unknown:
        raise ValueError(f"protocols must be among {PROTOCOLS} (got {unknown[0]!r})")
    if "tiles" not in names:
        raise ValueError(f"protocols must include 'tiles': a call too large for words and lines "
                         f"goes in tiles (got {tuple(names)})")
    return tuple(name for name in PROTOCOLS if name in names)


def launcher(value=None, env=os.environ):
    """The launcher asked for: ``value`` (one of ``LAUNCHERS``), else
    ``CUPY_DCP_LAUNCHER``, else ``None`` (the first that runs here)."""
    from .kernels._launch import LAUNCHERS  # here: it imports Numba's CUDA target

    if value is not None:
        if value not in LAUNCHERS:
            raise ValueError(f"launcher must be one of {LAUNCHERS} or None (got {value!r})")
        return value
    setting = env.get("CUPY_DCP_LAUNCHER", "")
    if setting == "":
        return None
    if setting not in LAUNCHERS:
        raise ValueError(f"CUPY_DCP_LAUNCHER must be one of {LAUNCHERS} (got {setting!r})")
    return setting


def kernel_cache_dir(env=os.environ):
    """The kernel cache's folder (a string), or ``None`` for no cache:
    ``CUPY_DCP_CACHE=0`` or an empty ``CUPY_DCP_CACHE_DIR`` turn it off (another
    ``CUPY_DCP_CACHE`` than ``0`` or ``1`` is a ``ValueError``), a
    ``CUPY_DCP_CACHE_DIR`` names it (``~`` expanded, made absolute here, so that
    a later ``chdir`` does not move it), else ``$XDG_CACHE_HOME/cupy_dcp`` (or
    ``~/.cache/cupy_dcp``: an ``XDG_CACHE_HOME`` that is not an absolute path is
    ignored, as the XDG specification asks)."""
    if _flag(env, "CUPY_DCP_CACHE") is False:
        return None
    path = env.get("CUPY_DCP_CACHE_DIR")
    if path is not None:
        return os.path.abspath(os.path.expanduser(path)) if path else None
    base = env.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.abspath(os.path.join(base, "cupy_dcp"))


# Variables an MPI launcher sets for the job it starts (ranks, its server's contact):
# a job of our own must not inherit them. A user's own MCA settings (OMPI_MCA_plm_...,
# say, where there is no ssh) it keeps.
_JOB_VARIABLES = ("PMIX_", "PMI_", "OMPI_COMM_WORLD", "OMPI_UNIVERSE", "OMPI_MCA_ess",
                  "OMPI_MCA_orte", "OMPI_MCA_pmix", "OMPI_MCA_initial_wdir", "OMPI_FILE_LOCATION",
                  "OMPI_APP_CTX", "OMPI_NUM_APP_CTX", "OMPI_FIRST_RANKS", "OMPI_ARGV",
                  "OMPI_COMMAND")


def spawn_environment(**extra):
    """The environment of processes that cupy_dcp starts itself (``bench
    --startup``'s ranks): this process's, less the variables an MPI launcher sets
    for its job (they would join ours to it), less ``CUPY_DCP_CACHE``, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_JOB_VARIABLES)}
    env.pop("CUPY_DCP_CACHE", None)
    env.update(extra)
    return env
