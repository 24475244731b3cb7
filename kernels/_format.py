"""The packed send-buffer format: lane counts, shapes and dtype views.

Defined here, on the kernels' side, so that the kernels import nothing of
``cupy_dcp``; ``cupy_dcp.layout`` re-exports it.

A rank's send buffer is ``[N, B, H/N, D + P]`` in the output dtype. Lanes
``0:D`` of ``send[r, b, h]`` hold ``out[b, r*H/N + h, :]``; the ``P`` trailing
lanes hold the bit pattern of the float32 ``lse[b, r*H/N + h]``: ``P = 2`` for
16-bit outputs (lane ``D`` the low half, lane ``D+1`` the high half), ``P = 1``
for float32 outputs (the value itself).

Where the lanes sit is stated here once: :data:`LSE_HALF_BITS` and
:data:`LSE_HALF_MASK` split the LSE's bits into lanes ``D`` (low) and ``D + 1``
(high), and every kernel that writes or reads the lanes (pack, combine, the
direct kernels, the host twins) takes them from here; :func:`lse_lanes` and
:func:`split_packed` are the host's (NumPy) side of the same.
"""

import numbers

import numpy as np

__all__ = [
    "BFLOAT16",
    "LSE_HALF_BITS",
    "LSE_HALF_MASK",
    "SUPPORTED_DTYPES",
    "as_dtype",
    "bits_dtype",
    "c_strides",
    "check_heads",
    "is_bfloat16",
    "is_supported",
    "lse_lanes",
    "lse_pack_dim",
    "round_from_float64",
    "send_buffer_shape",
    "split_packed",
]

LSE_HALF_BITS = 16  # a 16-bit output's LSE: lane D the low 16 bits, lane D + 1 the high 16
LSE_HALF_MASK = 0xFFFF

# ``BFLOAT16`` (``ml_dtypes.bfloat16`` as a NumPy dtype) and ``SUPPORTED_DTYPES`` are
# made on first use (module ``__getattr__``): importing ml_dtypes costs most of a
# second, which a float16 or float32 caller need not pay; a bfloat16 caller has it
# already.
_NAMES = {"float16": np.dtype(np.float16), "fp16": np.dtype(np.float16),
          "half": np.dtype(np.float16), "float32": np.dtype(np.float32),
          "fp32": np.dtype(np.float32)}
_BF16_NAMES = ("bfloat16", "bf16")
_SUPPORTED_NAMES = ("float16", "bfloat16", "float32")


def _bfloat16():
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def __getattr__(name):
    if name == "BFLOAT16":
        return _bfloat16()
    if name == "SUPPORTED_DTYPES":
        return (np.dtype(np.float16), _bfloat16(), np.dtype(np.float32))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def is_bfloat16(dtype):
    """Whether the NumPy dtype ``dtype`` is ``ml_dtypes.bfloat16`` (without importing
    ml_dtypes: an array of that dtype has imported it already)."""
    return dtype.name == "bfloat16" and dtype.itemsize == 2 and dtype.kind == "V"


def is_supported(dtype):
    """Whether the NumPy dtype ``dtype`` is one the kernels take: float16, bfloat16 or
    float32."""
    return is_bfloat16(dtype) or (dtype.kind == "f" and dtype.name in _SUPPORTED_NAMES)


def as_dtype(dtype):
    """Return ``dtype`` as a NumPy dtype; ``"bfloat16"`` means ``ml_dtypes.bfloat16``.

    Anything NumPy cannot name (a torch dtype, say) is looked up by its
    ``str()`` without a ``torch.`` prefix, so ``torch.bfloat16`` and
    ``torch.int64`` work without importing torch.
    """
    if isinstance(dtype, str) and dtype.lower() in _NAMES:
        return _NAMES[dtype.lower()]
    if isinstance(dtype, str) and dtype.lower() in _BF16_NAMES:
        return _bfloat16()
    try:
        return np.dtype(dtype)
    except TypeError:
        name = str(dtype).rsplit(".", 1)[-1].lower()
        if name in _NAMES:
            return _NAMES[name]
        if name in _BF16_NAMES:
            return _bfloat16()
        try:
            return np.dtype(name)
        except TypeError:
            raise TypeError(f"not a dtype NumPy knows (got {dtype!r})") from None


def lse_pack_dim(dtype):
    """Number of trailing lanes ``P`` that carry the float32 LSE bits.

    Args:
        dtype: the output dtype (NumPy dtype, ``ml_dtypes.bfloat16`` or the
            string ``"bfloat16"``).

    Returns:
        2 for float16 and bfloat16, 1 for float32.

    Raises:
        ValueError: for any other dtype.
    """
    try:
        dt = as_dtype(dtype)
    except TypeError:
        dt = None
    if dt is not None and is_supported(dt):
        return 1 if dt.itemsize == 4 else 2
    raise ValueError(
        f"output dtype must be float16, bfloat16 or float32 (got {dtype!r})")


def bits_dtype(dtype):
    """The unsigned integer dtype of the same size (how kernels see the data)."""
    return np.dtype(np.uint16) if as_dtype(dtype).itemsize == 2 else np.dtype(np.uint32)


def check_count(value, name, minimum=None):
    """``value`` must be an integer (not a bool: ``TypeError``) >= ``minimum`` (``None``:
    any; else ``ValueError``); returned as ``int``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer (got {type(value).__name__} {value!r})")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum} (got {value})")
    return int(value)


def check_flag(value, name):
    """``value`` must be ``True`` or ``False`` (NumPy's bool too): ``TypeError`` else."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False (got {value!r})")
    return bool(value)


def check_rank(value, world_size, name="self_rank"):
    """``value`` must be an integer in ``[0, world_size)`` (``TypeError``, ``ValueError``):
    a kernel indexes rows by it."""
    value = check_count(value, name)
    if not 0 <= value < world_size:
        raise ValueError(f"{name} must be in [0, {world_size}) (got {value})")
    return value


def check_heads(num_heads, world_size):
    """Every rank keeps ``H/N`` heads: ``ValueError`` naming H and N unless N divides H
    (``TypeError`` unless both are integers, ``ValueError`` unless ``N >= 1``)."""
    check_count(num_heads, "num_heads")
    check_count(world_size, "world_size", 1)
    if num_heads % world_size:
        raise ValueError(
            f"num_heads must be divisible by world_size (got H={num_heads}, N={world_size})")
    return num_heads // world_size


def self_overlapping(shape, strides, itemsize):
    """Whether two elements of an array of ``shape`` and byte ``strides`` may share
    memory: taken by the size of their strides, each axis of more than one element
    must step past all the bytes the axes below it reach (a stride of 0 never does).
    Conservative: axes that interleave without a collision count as overlapping."""
    if any(int(e) == 0 for e in shape):
        return False  # no element at all
    reach = itemsize
    for stride, extent in sorted((abs(int(s)), int(e)) for e, s in zip(shape, strides) if e > 1):
        if stride < reach:
            return True
        reach += stride * (extent - 1)
    return False


def check_not_overlapping(shape, strides, itemsize, name):
    """``ValueError`` where an array written by a kernel has elements that share memory
    (:func:`self_overlapping`): the writes of different rows would race."""
    if self_overlapping(shape, strides, itemsize):
        raise ValueError(f"{name} must not have elements that share memory (got shape "
                         f"{tuple(shape)}, strides {tuple(strides)}): a stride of 0 or "
                         "overlapping axes would make the kernels' writes race")


# why a kernel's output must not share memory with its inputs (check_apart's message)
WRITES_WHILE_READING = "a kernel would write it while its other blocks still read the inputs"
# why two results of one call must not share memory (check_apart's message)
WRITES_BOTH = "the call writes both, so one would overwrite the other"
_OVERLAP_WORK = 1 << 16  # the most work NumPy may spend proving two views apart
_TOO_HARD = getattr(np, "exceptions", np).TooHardError  # (NumPy < 1.25: np.TooHardError)


def views_share(a, b):
    """Whether NumPy arrays ``a`` and ``b`` share a byte, by NumPy's exact test within
    :data:`_OVERLAP_WORK`; a case too hard for it counts as sharing."""
    try:
        return bool(np.shares_memory(a, b, max_work=_OVERLAP_WORK))
    except _TOO_HARD:
        return True


def _address_views(a, b, low, high):
    """NumPy arrays with the addresses, shapes and strides of device arrays ``a`` and
    ``b`` (:class:`DeviceArray`), over one ctypes window of bytes ``low`` to ``high``
    that spans both: for ``numpy.shares_memory``, which compares addresses and never
    reads an element."""
    import ctypes

    window = (ctypes.c_char * (high - low)).from_address(low)
    return tuple(np.ndarray(arr.shape, np.dtype(f"V{arr.dtype.itemsize}"), window,
                            arr.ptr - low, arr.strides) for arr in (a, b))


def check_apart(written, read, why):
    """``ValueError`` where an array a call writes (``written``: ``{name: DeviceArray}``,
    ``None`` values skipped) shares a byte with one it reads (``read``, alike). Views
    whose extents (:meth:`DeviceArray.extent`) do not cross are apart; where they
    cross, NumPy's exact test judges (two interleaved views of one buffer whose
    elements never meet are apart), and a case too hard for it counts as sharing.
    ``why`` ends the message."""
    for out_name, out in written.items():
        if out is None:
            continue
        low, high = out.extent()
        for in_name, arr in read.items():
            if arr is None:
                continue
            first, end = arr.extent()
            if not (low < end and first < high):
                continue
            if views_share(*_address_views(out, arr, min(low, first), max(high, end))):
                raise ValueError(f"{out_name} shares memory with {in_name} (within bytes "
                                 f"{max(low, first):#x} to {min(high, end):#x}): {why}")


def c_strides(shape, itemsize):
    """Byte strides of a C-contiguous array of ``shape``."""
    strides, step = [], itemsize
    for extent in reversed(shape):
        strides.insert(0, step)
        step *= extent
    return tuple(strides)


def send_buffer_shape(world_size, num_tokens, num_heads, head_dim, dtype):
    """Shape ``(N, B, H/N, D + P)`` of the packed send (and receive) buffer: ``ValueError``
    for a negative B or H or a D below 1 (and as :func:`check_heads`)."""
    check_heads(num_heads, world_size)
    check_count(num_tokens, "num_tokens", 0)
    check_count(num_heads, "num_heads", 0)
    check_count(head_dim, "head_dim", 1)
    return (world_size, num_tokens, num_heads // world_size,
            head_dim + lse_pack_dim(dtype))


def round_from_float64(values, dtype):
    """``values`` (float64) rounded once, to nearest even, to ``dtype``.

    float32 and float16 conversions of NumPy round once. bfloat16 goes through
    float32 rounded to odd (an inexact result gets an odd last bit), which
    keeps the final rounding to nearest even exact: no double rounding.
    """
    dtype = as_dtype(dtype)
    values = np.asarray(values, dtype=np.float64)
    if not is_bfloat16(dtype):
        return values.astype(dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        narrow = values.astype(np.float32)
        bits = narrow.view(np.uint32).copy()
        wide = narrow.astype(np.float64)
        sticky = (wide != values) & np.isfinite(values) & ((bits & np.uint32(1)) == 0)
        away = np.abs(wide) > np.abs(values)
    bits[sticky & away] -= np.uint32(1)
    bits[sticky & ~away] += np.uint32(1)
    return bits.view(np.float32).astype(dtype)


def lse_lanes(lse_bits, pack_dim):
    """The ``pack_dim`` lanes ``[..., P]`` (uint32) that carry the float32 LSE bits
    ``lse_bits`` (uint32) in a packed row: the bits themselves for ``P = 1``, their
    low and high halves for ``P = 2``."""
    lse_bits = np.asarray(lse_bits, dtype=np.uint32)
    if pack_dim == 1:
        return lse_bits[..., None]
    return np.stack([lse_bits & np.uint32(LSE_HALF_MASK),
                     lse_bits >> np.uint32(LSE_HALF_BITS)], axis=-1)


def split_packed(recv, head_dim):
    """``(partials, lses)`` of packed rows ``recv [..., D + P]`` (float16, bfloat16 or
    float32): the partials ``[..., D]`` (a view, in ``recv``'s dtype) and the LSEs
    ``[...]`` (float32), read from the trailing lanes as :func:`lse_lanes` writes
    them. ``ValueError`` unless the rows have ``head_dim + P`` lanes."""
    recv = np.asarray(recv)
    dtype = as_dtype(recv.dtype)
    pack_dim = lse_pack_dim(dtype)
    if recv.ndim < 1 or recv.shape[-1] != head_dim + pack_dim:
        raise ValueError(f"recv's rows must have head_dim + {pack_dim} = {head_dim + pack_dim} "
                         f"lanes (got shape {recv.shape})")
    lanes = recv[..., head_dim:].view(bits_dtype(dtype)).astype(np.uint32)
    lse_bits = lanes[..., 0]
    if pack_dim == 2:
        lse_bits = lse_bits | (lanes[..., 1] << np.uint32(LSE_HALF_BITS))
    return recv[..., :head_dim], np.ascontiguousarray(lse_bits).view(np.float32)
