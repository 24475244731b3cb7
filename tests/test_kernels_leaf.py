"""``kernels/`` is a leaf package: no module under it imports ``cupy_dcp`` (which
builds on the kernels, never the reverse)."""

import ast
from pathlib import Path

import pytest

KERNELS = Path(__file__).resolve().parent.parent / "kernels"
MODULES = sorted(KERNELS.rglob("*.py"))


def _imports_outside(path, root=KERNELS):
    """The imports of ``path`` that leave the package at ``root``: relative ones that
    climb above it, and absolute ones of ``cupy_dcp`` other than its ``kernels``."""
    depth = len(path.relative_to(root).parts) - 1  # subpackages between root and path
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level > depth + 1:
            found.append(f"line {node.lineno}: from {'.' * node.level}{node.module or ''}")
        names = ([node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                 else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
        for name in names:
            if name.split(".")[0] == "cupy_dcp" and not name.startswith("cupy_dcp.kernels"):
                found.append(f"line {node.lineno}: {name}")
    return found


def test_there_are_kernel_modules_to_check():
    assert KERNELS / "_format.py" in MODULES and KERNELS / "direct" / "__init__.py" in MODULES


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(KERNELS)))
def test_no_kernel_module_imports_cupy_dcp(path):
    assert _imports_outside(path) == []


def test_the_check_sees_imports_that_leave(tmp_path):
    inner = tmp_path / "direct"
    inner.mkdir()
    (inner / "m.py").write_text("from ...layout import as_dtype\nfrom .._format import c_strides\n"
                                "import cupy_dcp.reduce\nfrom cupy_dcp.kernels import pack\n")
    assert _imports_outside(inner / "m.py", tmp_path) == ["line 1: from ...layout",
                                                          "line 3: cupy_dcp.reduce"]
