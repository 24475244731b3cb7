"""Signed host exchanges: every message carries its sender's signature, checked on arrival.

A signed message is a body followed by a trailer of ``TRAILER_BYTES``: a magic
word, the message's kind, and the sender's signature (the values a call's ranks
must share: sizes, dtype, strategy, a call number). Messages travel point to
point on the communicator's own duplicate, each received at whatever size it
has (the size is probed first), so nothing is truncated and nothing waits for
bytes that never come. Every rank receives one message from every peer, so
every rank holds every signature, and :func:`verdict` raises the same error on
every rank, worded the same way, wherever they differ.

Kinds: ``DATA`` (a call's exchange), ``AGREE`` (a consistency check: the body
is the pickled fields), ``FAILED`` (the sender failed its own checks: the body
is the error's message, the signature the error's type).
"""

import pickle
import time

import numpy as np
from mpi4py import MPI

__all__ = ["AGREE", "DATA", "FAILED", "TRAILER_BYTES", "check_notices", "exchange",
           "failure_message", "first_difference", "give_up_on_all", "verdict", "write_trailer"]

TRAILER_BYTES = 128
_WORDS = TRAILER_BYTES // 8
_MAGIC = 0x5DC9_7A11_E500_0001
DATA, AGREE, FAILED = 1, 2, 3
_KIND_NAMES = {DATA: "exchange", AGREE: "consistency check"}
_TAG = 0x5DC
_GAVE_UP_TAG = 0x5DD
_ERRORS = (ValueError, TypeError, RuntimeError)
_MAX_MESSAGE = 2000  # bytes of a failed rank's message that travel
SPIN_S = 2e-3  # a wait polls without sleeping this long first: a healthy call is that quick


def _encode(value):
    if isinstance(value, str):
        raw = value.encode("ascii")
        if len(raw) > 8:
            raise ValueError(f"a signature string has at most 8 characters (got {value!r})")
        return int.from_bytes(raw.ljust(8, b"\0"), "little", signed=True)
    return int(value)


def _decode(word, like):
    if isinstance(like, bool):
        return bool(word)
    if isinstance(like, str):
        return int(word).to_bytes(8, "little", signed=True).rstrip(b"\0").decode("ascii", "replace")
    return int(word)


def write_trailer(rows, kind, signature):
    """Write the trailer (the last ``TRAILER_BYTES`` of each row of the uint8 ``rows``)."""
    values = [_encode(v) for v in signature.values()]
    if len(values) > _WORDS - 3:
        raise ValueError(f"a signature has at most {_WORDS - 3} fields (got {len(values)})")
    words = np.zeros(_WORDS, dtype=np.int64)
    words[:3] = (_MAGIC, kind, len(values))
    words[3:3 + len(values)] = values
    rows[:, -TRAILER_BYTES:] = words.view(np.uint8)


def _read_trailer(message, signature):
    """``(kind, values)`` of a received message; ``(None, ())`` if it carries none."""
    if message.nbytes < TRAILER_BYTES:
        return None, ()
    words = np.frombuffer(message[-TRAILER_BYTES:].tobytes(), dtype=np.int64)
    if int(words[0]) != _MAGIC:
        return None, ()
    kind, count = int(words[1]), int(words[2])
    if kind == FAILED:
        return kind, (int(words[3]),)
    likes = list(signature.values())
    if count != len(likes):
        return kind, tuple(int(w) for w in words[3:3 + count])
    return kind, tuple(_decode(w, like) for w, like in zip(words[3:3 + count], likes))


def failure_message(exc):
    """A failed rank's message: its error's message as bytes, and the error's type code."""
    code = next((i for i, kind in enumerate(_ERRORS) if isinstance(exc, kind)), 2)
    text = str(exc).encode("utf-8", "replace")[:_MAX_MESSAGE]
    message = np.zeros((1, len(text) + TRAILER_BYTES), dtype=np.uint8)
    message[0, :len(text)] = np.frombuffer(text, dtype=np.uint8)
    write_trailer(message, FAILED, {"error": code})
    return message


def exchange(comm, send, recv, what, limit):
    """Send row ``r`` of ``send`` to rank ``r`` (a single row goes to every peer) and
    receive one message from every peer, within ``limit`` seconds (``inf``: no bound).

    ``recv`` (``[N, M]`` uint8, or ``None``) receives a peer's message when it has
    ``M`` bytes; one of another size gets an array of its own. Returns the list of
    received messages, ``None`` at this rank's own place.

    Raises:
        RuntimeError: a peer's message did not arrive (or ours did not leave) in
            time, or a peer gave up waiting for this rank earlier; the
            communicator is unusable either way.
    """
    mpi, rank, n = comm.mpi_comm, comm.rank, comm.world_size
    peers = [p for p in range(n) if p != rank]
    requests = [mpi.Isend([send[p if send.shape[0] > 1 else 0], MPI.BYTE], dest=p, tag=_TAG)
                for p in peers]
    got = [None] * n
    waiting = list(peers)
    status = MPI.Status()
    start = time.monotonic()
    deadline = start + limit
    while True:
        for p in list(waiting):
            message = mpi.Improbe(source=p, tag=_TAG, status=status)
            if message is None:
                continue
            size = status.Get_count(MPI.BYTE)
            fits = recv is not None and recv.shape[1] == size
            buf = recv[p] if fits else np.empty(size, np.uint8)
            requests.append(message.Irecv([buf, MPI.BYTE]))
            got[p] = buf
            waiting.remove(p)
        if not waiting and MPI.Request.Testall(requests):
            break
        now = time.monotonic()
        if now > deadline:
            _give_up(comm, what, waiting, limit, (requests, send, recv, got))
        if now > start + SPIN_S:
            # a peer that gave up on this rank: raise now (a large message of ours may
            # never leave, since nobody takes it), keeping the buffers MPI may still use
            check_notices(comm, (requests, send, recv, got))
            time.sleep(50e-6)
    check_notices(comm)
    return got


def _give_up(comm, what, waiting, limit, keep):
    comm._abandoned.append(keep)  # MPI may still read or write these buffers
    give_up_on_all(comm, waiting)  # the late ranks (all, if none is known) raise on arrival
    who = "rank" if len(waiting) == 1 else "ranks"
    missing = (f"no message from {who} {', '.join(map(str, waiting))}" if waiting
               else "a peer did not take this rank's message")
    reason = (f"MPI {what} did not complete within {limit} s on rank {comm.rank} ({missing}: "
              "a peer rank is missing or stuck); the communicator is unusable: abort the job")
    comm._broken = reason
    raise RuntimeError(reason)


def give_up_on_all(comm, peers=()):
    """Tell ``peers`` (every other rank where none are named: a collective timed out)
    that this rank gave up waiting: each raises at its next check
    (:func:`check_notices`) instead of waiting its own timeout."""
    for p in peers or [p for p in range(comm.world_size) if p != comm.rank]:
        comm._abandoned.append(comm.mpi_comm.Isend([np.zeros(1, np.uint8), MPI.BYTE], dest=p,
                                                    tag=_GAVE_UP_TAG))


def check_notices(comm, pending=None):
    """Raise ``RuntimeError`` (and mark ``comm`` unusable) if a peer gave up waiting
    for this rank; ``pending``: what MPI may still use, kept alive then."""
    status = MPI.Status()
    message = comm.mpi_comm.Improbe(source=MPI.ANY_SOURCE, tag=_GAVE_UP_TAG, status=status)
    if message is None:
        return
    if pending is not None:
        comm._abandoned.append(pending)
    message.Recv([np.empty(1, np.uint8), MPI.BYTE])
    reason = (f"rank {status.Get_source()} gave up waiting for rank {comm.rank} (it arrived "
              "after the timeout): this call's result is void and the communicator is "
              "unusable: abort the job")
    comm._broken = reason
    raise RuntimeError(reason)


def verdict(what, rank, kind, signature, got, own_error=None):
    """Raise the same error on every rank where the messages ``got`` (from
    :func:`exchange`) and this rank's own ``kind`` and ``signature`` disagree.

    Checked in this order, so that every rank finds the same first difference:
    the lowest rank that failed its own checks (its error's type, on every rank;
    that rank re-raises ``own_error``), the kind of step, then each field of the
    signature. Returns the decoded bodies of AGREE messages (``None`` elsewhere).
    """
    kinds, values, bodies = [], [], []
    for r, message in enumerate(got):
        if r == rank:
            kinds.append(FAILED if own_error is not None else kind)
            values.append(tuple(signature.values()))
            bodies.append(None)
            continue
        k, v = _read_trailer(message, signature)
        kinds.append(k)
        values.append(v)
        bodies.append(message[:-TRAILER_BYTES] if k is not None else message)
    for r, k in enumerate(kinds):
        if k == FAILED:
            if r == rank:
                raise own_error
            error = _ERRORS[values[r][0]] if 0 <= values[r][0] < len(_ERRORS) else RuntimeError
            text = bytes(bodies[r]).decode("utf-8", "replace")
            raise error(f"{what}: rank {r} failed its checks: {text}")
    for r, k in enumerate(kinds):
        if k is None:
            raise ValueError(f"{what}: rank {r} sent {got[r].nbytes} bytes that carry no "
                             "signature (a message of another kind, or one cut short)")
    first_difference(what, "the step", [_KIND_NAMES.get(k, k) for k in kinds])
    names = list(signature)
    for i, name in enumerate(names):
        first_difference(what, name, [v[i] if i < len(v) else None for v in values])
    if kind == AGREE:
        return [None if b is None else pickle.loads(bytes(b)) for b in bodies]
    return bodies


def first_difference(what, name, values):
    differ = [r for r, v in enumerate(values) if v != values[0]]
    if differ:
        got = ", ".join(f"rank {r}: {values[r]!r}" for r in differ)
        raise ValueError(f"{what}: ranks disagree on {name} (rank 0: {values[0]!r}; {got})")
