"""The device path's divergence record, read on the host: the combine's status words
become one error, the same on every rank (the first peer and field marked)."""

import numpy as np
import pytest

from cupy_dcp._divergence import A2A_CODE, divergence_message
from cupy_dcp.kernels._trailer import (DTYPE_CODES, FIELDS, STATUS_WORDS, TRAILER_BYTES, WORDS,
                                       trailer_rows)


def status(n, *marks):
    words = np.zeros(n * WORDS * STATUS_WORDS, np.int64)
    view = words.reshape(n, WORDS, STATUS_WORDS)
    for peer, field, first, theirs in marks:
        view[peer, FIELDS.index(field)] = (1, first, theirs)
    return words


def test_nothing_marked_is_no_error():
    assert divergence_message("DcpA2APlan", status(3)) is None


@pytest.mark.parametrize("field, first, theirs, shown", [
    ("dtype", DTYPE_CODES["float16"], DTYPE_CODES["bfloat16"], "'float16'; rank 2: 'bfloat16'"),
    ("is_lse_base_on_e", 1, 0, "True; rank 2: False"),
    ("tokens", 3, 4, "3; rank 2: 4"),
    ("call_number", 7, 8, "7; rank 2: 8"),
    ("strategy", A2A_CODE, 9, "'a2a'; rank 2: 9"),
])
def test_a_marked_field_names_both_values(field, first, theirs, shown):
    got = divergence_message("DcpA2APlan", status(3, (2, field, first, theirs)))
    assert got == (f"DcpA2APlan: ranks disagree on {field} (rank 0: {shown}) in an earlier "
                   "call: its result is void")


def test_the_first_peer_and_field_win_and_a_missing_signature_says_why():
    words = status(3, (2, "head_dim", 8, 9), (1, "call_number", 4, 5), (1, "dtype", 1, 2))
    assert divergence_message("P", words) == (
        "P: ranks disagree on dtype (rank 0: 'float16'; rank 1: 'bfloat16') in an earlier call: "
        "its result is void")
    words = status(2, (1, "the signature", 0x5DC97A11, 12345), (1, "tokens", 3, 0))
    assert divergence_message("P", words) == (
        "P: rank 1's chunk carried no signature in an earlier call (the ranks' calls differ in "
        "tokens, heads or head size, or a rank skipped a call): its result is void")


@pytest.mark.parametrize("heads, width, itemsize, rows", [
    (1, 3, 2, 6), (2, 10, 2, 1), (1, 4, 4, 2), (8, 130, 2, 1), (1, 33, 4, 1)])
def test_the_trailer_rows_hold_the_signature(heads, width, itemsize, rows):
    assert trailer_rows(heads, width, itemsize) == rows
    assert rows * heads * width * itemsize >= TRAILER_BYTES > (rows - 1) * heads * width * itemsize
