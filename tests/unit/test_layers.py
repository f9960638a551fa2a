"""The package layers (README "Layers"): which package may import which, read from the
source with :mod:`ast` (every ``import``, also those inside functions)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import fgpu

SRC = Path(fgpu.__file__).parent


def _imports(package: str) -> dict[str, set[str]]:
    """Module file (relative to ``src/fgpu``) -> the ``fgpu`` modules it imports."""
    found: dict[str, set[str]] = {}
    for path in sorted((SRC / package).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
                names.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
        found[str(path.relative_to(SRC))] = {
            n for n in names if n.split(".")[0] in ("fgpu", "fgpu_standin")
        }
    return found


def _offending(package: str, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(
        f"{module} imports {name}"
        for module, names in _imports(package).items()
        for name in names
        if any(name == f or name.startswith(f + ".") for f in forbidden)
    )


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("k8s", ("fgpu.server", "fgpu.cli")),
        ("server", ("fgpu.k8s", "fgpu.cli")),
        ("rules", ("fgpu.server", "fgpu.k8s", "fgpu.cli", "fgpu.client")),
        ("sched", ("fgpu.server", "fgpu.k8s", "fgpu.cli", "fgpu.client", "fgpu.rules")),
        ("model", ("fgpu.server", "fgpu.k8s", "fgpu.cli", "fgpu.client", "fgpu.sched")),
    ],
)
def test_a_layer_does_not_import_the_layers_above_it(
    package: str, forbidden: tuple[str, ...]
) -> None:
    assert _offending(package, forbidden) == []


def test_the_client_is_the_http_client_only() -> None:
    # the typed client needs the wire models and nothing of the service, the adapters or
    # the command line
    for module, names in _imports("client").items():
        assert {
            n for n in names if not n.startswith(("fgpu.client", "fgpu.wire", "fgpu.addresses"))
        } == set(), module


def test_only_the_entry_point_imports_the_command_line() -> None:
    users = [
        f"{module} imports {name}"
        for package in sorted(p.name for p in SRC.iterdir() if p.is_dir() and p.name != "cli")
        for module, names in _imports(package).items()
        for name in names
        if name == "fgpu.cli" or name.startswith("fgpu.cli.")
    ]
    assert users == []


def test_the_product_does_not_import_the_api_stand_in() -> None:
    # fgpu_standin (the Kubernetes API TEST STAND-IN) serves the tests and the
    # `fgpu k8s standin|kubelet` commands; nothing else of fgpu reaches it
    users = [
        f"{module} imports {name}"
        for package in sorted(p.name for p in SRC.iterdir() if p.is_dir())
        for module, names in _imports(package).items()
        for name in names
        if name.startswith("fgpu_standin") and module != "cli/k8s.py"
    ]
    assert users == []
