"""Hatchling build hook: compiles fgpu's native code (native/build.py) into
``src/fgpu/_native/`` for wheels and editable installs, and ships the outputs in the wheel.

The outputs are ignored by git, so they are added with ``force_include`` (hatchling leaves
VCS-ignored files out otherwise). The wheel then holds machine code: it is tagged for this
platform, not ``py3-none-any``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


def _load_native_build(root: Path) -> Any:
    spec = importlib.util.spec_from_file_location("fgpu_native_build", root / "native" / "build.py")
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {root / 'native' / 'build.py'}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


class NativeBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        root = Path(self.root)
        out = root / "src" / "fgpu" / "_native"
        native_build = _load_native_build(root)
        outputs = native_build.build(out)
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        if version == "editable":
            return  # the editable install imports fgpu from src/, where the outputs are
        for path in outputs:
            rel = Path(path).relative_to(root / "src")
            build_data["force_include"][str(path)] = str(rel)
