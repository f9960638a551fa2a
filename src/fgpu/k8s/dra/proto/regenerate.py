"""Regenerate the Python modules of the ``.proto`` files in this folder.

Run from anywhere: ``python -m fgpu.k8s.dra.proto.regenerate`` (needs ``grpcio-tools``,
a development dependency). The generated ``*_pb2.py``, ``*_pb2.pyi`` and ``*_pb2_grpc.py``
are committed so that installing fgpu needs no code generator; a test checks that they
match what this script makes from the ``.proto`` files.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[3]  # the folder that holds the ``fgpu`` package
PROTOS = ("dra_v1.proto", "pluginregistration.proto")


def regenerate(out: Path = SRC) -> None:
    """Write the generated modules under ``out`` (the ``src`` folder by default).

    Raises:
        RuntimeError: protoc failed.
    """
    from grpc_tools import protoc

    for name in PROTOS:
        args = [
            "protoc",
            f"-I{SRC}",
            f"--python_out={out}",
            f"--pyi_out={out}",
            f"--grpc_python_out={out}",
            str((HERE / name).relative_to(SRC)),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {name}")


if __name__ == "__main__":
    regenerate(Path(sys.argv[1]) if len(sys.argv) > 1 else SRC)
