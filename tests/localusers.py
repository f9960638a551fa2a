"""Real local users for the multi-user tests: ``fgpu-test-alice``, ``fgpu-test-bob`` and
``fgpu-test-carol``, and the group ``fgpu-test-team`` that only alice belongs to.

They are created with ``groupadd``/``useradd`` when missing (the tests run as root) and left
in place (creating them again on every run would only churn ``/etc/passwd``). Tests that need
them skip, saying why, when the suite does not run as root or the tools are missing.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from collections.abc import Sequence

import pytest

ALICE = "fgpu-test-alice"
BOB = "fgpu-test-bob"
CAROL = "fgpu-test-carol"
TEAM = "fgpu-test-team"
"""A Unix group with alice as a supplementary member, bob not."""

_TOOLS = ("useradd", "groupadd", "usermod", "setpriv")


def ensure_users() -> None:
    """Create the test users and group when missing; skip (with the reason) when this is not
    possible here."""
    if os.geteuid() != 0:
        pytest.skip("multi-user tests need root to create local users and switch to them")
    missing = [tool for tool in _TOOLS if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"multi-user tests need {', '.join(missing)} (package passwd, util-linux)")
    if subprocess.run(["getent", "group", TEAM], capture_output=True).returncode != 0:
        subprocess.run(["groupadd", TEAM], check=True)
    for user in (ALICE, BOB, CAROL):
        try:
            pwd.getpwnam(user)
        except KeyError:
            subprocess.run(
                ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", user],
                check=True,
            )
    subprocess.run(["usermod", "-a", "-G", TEAM, ALICE], check=True)


def as_user(name: str) -> Sequence[str]:
    """A command prefix that runs the rest as ``name`` with their groups (``setpriv``)."""
    return ["setpriv", f"--reuid={name}", f"--regid={pwd.getpwnam(name).pw_gid}", "--init-groups"]


def uid_of(name: str) -> int:
    """The uid of the local user ``name``."""
    return pwd.getpwnam(name).pw_uid
