import argparse
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ._typing import CaseMaker, MPIComm, Stream

STRATEGIES: tuple[str, ...]
MODES: tuple[str, ...]

def parse_args(argv: list[str] | None = None,
               extra_cases: Iterable[str] = (), prog: str | None = None) -> argparse.Namespace: ...
def gpu_time(fn: Callable[[], object], stream: Stream, reps: int, calls: int, graph: bool,
             world: MPIComm) -> tuple[float, float]: ...
def run(args: argparse.Namespace,
        extra_cases: Mapping[str, CaseMaker] | None = None) -> list[dict[str, Any]]: ...
def main(argv: list[str] | None = None) -> None: ...
