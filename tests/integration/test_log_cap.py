"""A workload's logs are capped (``fgpu serve --max-log-bytes``; issue 27): a real workload
writes far more than the cap; its log keeps the first half of the cap and the latest output,
and ``fgpu logs`` says where bytes were dropped and how many. Bad values of the flag are
refused at start."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from fgpu.log_files import segments
from tests.serverproc import FGPU, started_server

CAP = 256 * 1024
LINES = 200_000  # `seq` writes about 1.3 MB


def test_fgpu_logs_says_the_cut_and_keeps_the_head_and_the_end() -> None:
    extra = ["--max-log-bytes", "256KiB"]
    with started_server("fgpu-logcap-", "1xA100-40GB", extra=extra) as server:
        script = f"seq 1 {LINES}; echo LAST-LINE; echo to-stderr >&2"
        workload = server.submit("--gpu", "0.1", command=["sh", "-c", script])
        server.wait_phase(workload, "succeeded")
        folder = server.state_dir / "logs" / workload
        kept = (folder / "output.log").stat().st_size + sum(
            p.stat().st_size for _, p in segments(folder / "output.log")
        )
        assert kept <= CAP + 70_000, kept  # a record may pass a segment by itself
        # each byte is stored once: no second copy of a stream beside the framed log
        assert not (folder / "stdout.log").exists()
        assert not (folder / "stderr.log").exists()
        both = server.cli("logs", workload).stdout
        assert both.startswith("1\n2\n3\n")
        assert "LAST-LINE\n" in both  # the latest output of both streams is kept
        assert "to-stderr\n" in both
        found = re.search(r"\[fgpu: (\d+) bytes of output dropped here", both)
        assert found is not None, both[:300]
        assert int(found[1]) > 500_000
        plain = server.cli("logs", "--stdout", workload).stdout
        assert plain.startswith("1\n2\n")
        assert plain.rstrip().endswith("LAST-LINE")
        assert "bytes of output dropped here" in plain  # the cut is said in each view
        # one stream, as the API serves it (read from the framed log), says the cut in text
        from fgpu.client import Client

        with Client(server.socket) as client:
            offset, text = 0, b""
            while True:
                data, offset = client.logs(workload, "stdout", offset)
                if not data:
                    break
                text += data
        assert re.search(
            rb"\[fgpu: \d+ bytes of output dropped here, from byte \d+: this log", text
        )
        assert text.startswith(b"1\n2\n3\n")
        assert b"to-stderr" not in text
        assert text.rstrip().endswith(b"LAST-LINE")


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("lots", "--max-log-bytes: 'lots'"),
        ("1000", "--max-log-bytes: '1000' is 1000 bytes; give 0 (no cap) or at least 65536"),
        ("-1MiB", "--max-log-bytes: '-1MiB'"),
    ],
)
def test_bad_log_caps_are_refused_at_start(value: str, says: str, tmp_path: Path) -> None:
    run = subprocess.run(
        [
            *FGPU,
            "serve",
            "--socket",
            str(tmp_path / "s.sock"),
            "--state-dir",
            str(tmp_path),
            "--simulate-gpus",
            "1xA100-40GB",
            "--max-log-bytes",
            value,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2, run.stderr
    assert says in run.stderr, run.stderr
