"""The web dashboard in a real browser (issue 15): headless Chromium (Debian's ``chromium``,
driven by Playwright with ``executable_path``; no browser download) against a real
``fgpu serve``. Through ``fgpu ui`` (the socket, as the user who runs it) the page loads
without console errors, draws the GPU split into its workloads' shares, and follows a
submit and a cancel without a reload; through the TCP listener (the token typed once) as
another user, a workload page refuses the log as the API does. Screenshots are saved under
``$FGPU_TEST_ARTIFACTS`` (default ``tmp/artifacts``)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.localusers import ALICE, as_user, ensure_users, uid_of
from tests.serverproc import FGPU, ServerProcess, sleeper, started_server, wait_for

playwright_api = pytest.importorskip("playwright.sync_api")
CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install chromium)"
)

TOKEN = "dashboard-token-0123456789abcdef"
WAIT_MS = 60_000
ARTIFACTS = Path(os.environ.get("FGPU_TEST_ARTIFACTS", Path(__file__).parents[2] / "tmp/artifacts"))


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[ServerProcess, int]]:
    user = None
    if os.geteuid() == 0:
        ensure_users()
        user = ALICE
    with started_server(
        "fgpu-ui-", "1xA100-40GB,1xH100-80GB", for_local_users=True, token=TOKEN, token_user=user
    ) as proc:
        yield proc, proc.tcp_port


@pytest.fixture(scope="module")
def ui_url(server: tuple[ServerProcess, int]) -> Iterator[str]:
    """``fgpu ui`` started as a user would; the URL it prints."""
    proc, _ = server
    ui = subprocess.Popen(
        [*FGPU, "ui", "--socket", str(proc.socket)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=proc.env,
    )
    try:
        assert ui.stdout is not None
        line = ui.stdout.readline()  # blocks until it prints (or exits)
        found = re.search(r"(http://127\.0\.0\.1:\d+/ui\?key=\S+)", line)
        assert found, f"fgpu ui printed {line!r}; stderr: {ui.stderr.read() if ui.poll() else ''}"
        yield found.group(1)
    finally:
        ui.terminate()
        ui.wait(30)


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    with playwright_api.sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield launched
        launched.close()


def shot(page: object, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name), full_page=True)  # type: ignore[attr-defined]


def test_the_gpu_map_follows_a_submit_and_a_cancel_without_a_reload(
    server: tuple[ServerProcess, int], ui_url: str, browser: object
) -> None:
    proc, _ = server
    expect = playwright_api.expect
    page = browser.new_page(viewport={"width": 1200, "height": 900})  # type: ignore[attr-defined]
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.goto(ui_url)
    expect(page.locator(".gpu")).to_have_count(2, timeout=WAIT_MS)
    page.evaluate("window.fgpuNoReload = 1")  # gone if the page is ever loaded again

    a100 = ("--gpu-model", "A100-40GB")
    a = proc.submit("-g", "0.5", "--name", "train-a", *a100, command=sleeper(300))
    b = proc.submit("-g", "0.5", "--name", "train-b", *a100, command=sleeper(300))
    for wid in (a, b):
        segment = page.locator(f'.share[data-workload="{wid}"]')
        expect(segment).to_have_count(1, timeout=WAIT_MS)
        expect(segment).to_have_attribute("data-share", "500", timeout=WAIT_MS)
    gpu = page.locator(".gpu", has=page.locator(f'.share[data-workload="{a}"]'))
    expect(gpu).to_have_attribute("data-allocated", "1000", timeout=WAIT_MS)
    expect(gpu.locator(".share")).to_have_count(2)  # both on one GPU, split in halves
    c = proc.submit("-g", "0.5", "--name", "third", *a100, command=sleeper(300))
    pending = page.locator(f'#pending tr[data-workload="{c}"]')
    expect(pending).to_have_count(1, timeout=WAIT_MS)
    expect(pending.locator(".reason")).to_contain_text(re.compile("fit"), timeout=WAIT_MS)
    shot(page, "dashboard-overview.png")

    proc.cli("cancel", a)
    expect(page.locator(f'.share[data-workload="{a}"]')).to_have_count(0, timeout=WAIT_MS)
    expect(page.locator(f'.share[data-workload="{c}"]')).to_have_count(1, timeout=WAIT_MS)
    expect(page.locator(f'.share[data-workload="{c}"]')).to_have_attribute("data-share", "500")
    assert page.evaluate("window.fgpuNoReload") == 1
    shot(page, "dashboard-after-cancel.png")
    assert problems == []

    # the workload's own page: request, placement, events, its log (the caller owns it)
    page.goto(ui_url.split("/ui?")[0] + f"/ui/workloads/{c}")
    expect(page.locator("#workload")).to_have_attribute("data-phase", "running", timeout=WAIT_MS)
    expect(page.locator("#workload-events")).to_contain_text("placed", timeout=WAIT_MS)
    expect(page.locator("#log pre")).to_have_count(1)
    shot(page, "dashboard-workload.png")

    # a long log opens scrolled to its newest line
    chatty = [sys.executable, "-c", LINES_THEN_SLEEP]
    d = proc.submit("-g", "0.25", "--name", "chatty", "--gpu-model", "H100-80GB", command=chatty)
    wait_for(lambda: "line 299" in proc.cli("logs", d).stdout, "the chatty workload's log")
    page.goto(ui_url.split("/ui?")[0] + f"/ui/workloads/{d}")
    expect(page.locator("#log pre")).to_contain_text("line 299", timeout=WAIT_MS)
    assert page.locator("#log pre").evaluate(NEWEST_LINE_SHOWN), "the log is not at its end"
    page.close()


LINES_THEN_SLEEP = (
    "import time\nfor i in range(300): print('line', i)\nimport sys; sys.stdout.flush()\n"
    "time.sleep(300)"
)
NEWEST_LINE_SHOWN = """e => {
  const range = document.createRange();
  range.selectNodeContents(e);
  const rects = range.getClientRects();
  const last = rects[rects.length - 1], box = e.getBoundingClientRect();
  return e.scrollHeight > e.clientHeight && last.bottom <= box.bottom + 1 && last.bottom > box.top;
}"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a second user's workload")
def test_another_users_log_is_refused_where_the_api_refuses_it(
    server: tuple[ServerProcess, int], browser: object
) -> None:
    """On TCP the token acts as alice; a root-owned workload's page shows its request and
    placement but not its log: the API's refusal is shown instead."""
    proc, tcp = server
    expect = playwright_api.expect
    marker = "secret-output-of-root"
    # the command (which every user sees) must not hold the text it prints
    printed = "'-'.join(['secret', 'output', 'of', 'root'])"
    command = [sys.executable, "-c", f"import time; print({printed}, flush=True); time.sleep(300)"]
    wid = proc.submit("-g", "0.25", "--name", "private", command=command)
    proc.wait_phase(wid, "running")
    wait_for(lambda: marker in proc.cli("logs", wid).stdout, "the workload's output in its log")
    page = browser.new_page()  # type: ignore[attr-defined]
    page.goto(f"http://127.0.0.1:{tcp}/ui")
    expect(page).to_have_url(re.compile(r"/ui/login$"), timeout=WAIT_MS)  # no token yet
    page.fill("input[name=token]", TOKEN)
    page.click("button[type=submit]")
    expect(page.locator(".gpu")).to_have_count(2, timeout=WAIT_MS)
    page.goto(f"http://127.0.0.1:{tcp}/ui/workloads/{wid}")
    expect(page.locator("#workload")).to_contain_text("private", timeout=WAIT_MS)
    refusal = page.locator("#log .refused")
    expect(refusal).to_contain_text("its logs are its owner's", timeout=WAIT_MS)
    assert marker not in page.content()
    assert str(uid_of(ALICE)) not in refusal.inner_text()  # it names the owner (root)
    shot(page, "dashboard-refused-log.png")
    page.close()


STREAMS = ["/bin/sh", "-c", "echo out 1; echo err 2 >&2; sleep 0.2; echo out 3; exec sleep 300"]
CONTRAST = """e => {
  const rgb = s => s.match(/[0-9.]+/g).slice(0, 3).map(Number);
  const lum = c => {
    const [r, g, b] = c.map(v => {
      v /= 255;
      return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4;
    });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  };
  const style = getComputedStyle(e);
  const a = lum(rgb(style.color)), b = lum(rgb(style.backgroundColor));
  let opacity = 1;
  for (let n = e; n; n = n.parentElement) opacity *= Number(getComputedStyle(n).opacity);
  return {ratio: (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05), opacity};
}"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run alice's workload")
def test_both_streams_the_user_on_each_share_and_a_legible_paused_mark(
    server: tuple[ServerProcess, int], browser: object
) -> None:
    """Issue 25, point 6: the workload page shows stdout and stderr in the order written; each
    share on the GPU map names its user; a share paused by priority is marked with a label
    whose contrast (computed by the browser from the page's CSS) meets WCAG AA, 4.5:1. On
    TCP the token acts as alice, whose workload it is."""
    proc, tcp = server
    expect = playwright_api.expect
    h100 = ("--gpu-model", "H100-80GB")
    out = proc.cli(
        "submit", "-g", "0.25", "--name", "streams", *h100, "--json", "--", *STREAMS,
        user=as_user(ALICE),
    ).stdout  # fmt: skip
    w = json.loads(out)["id"]
    wait_for(
        lambda: "out 3" in proc.cli("logs", "--stdout", w).stdout,
        "both streams written",
        timeout_s=WAIT_MS / 1000,
    )
    page = browser.new_page(viewport={"width": 1200, "height": 900})  # type: ignore[attr-defined]
    base = f"http://127.0.0.1:{tcp}"
    page.goto(f"{base}/ui/login")
    page.fill("input[name=token]", TOKEN)
    page.click("button[type=submit]")
    expect(page.locator(".gpu")).to_have_count(2, timeout=WAIT_MS)
    page.goto(f"{base}/ui/workloads/{w}")
    log = page.locator("#log pre")
    expect(log).to_contain_text("out 3", timeout=WAIT_MS)
    text = log.inner_text()
    assert text.index("out 1") < text.index("err 2") < text.index("out 3"), text
    expect(page.locator("#log pre .stderr").first).to_contain_text("err 2")
    expect(page.locator("#log pre .stdout").first).to_contain_text("out 1")
    shot(page, "dashboard-both-streams.png")

    # a critical service beside it is busy (no hint): alice's share is paused by priority
    crit = proc.submit("-g", "0.25", "--name", "svc", "-p", "critical", *h100, command=sleeper(300))
    page.goto(f"{base}/ui")
    share = page.locator(f'.share[data-workload="{w}"]')
    expect(share).to_have_attribute("data-marks", re.compile("paused-by-priority"), timeout=WAIT_MS)
    expect(share.locator(".label")).to_contain_text(f"streams {ALICE} 0.25")
    expect(page.locator(f'.share[data-workload="{crit}"] .label')).to_contain_text("svc root")
    seen = share.locator(".label").evaluate(CONTRAST)
    assert seen["opacity"] == 1, seen
    assert seen["ratio"] >= 4.5, seen
    shot(page, "dashboard-paused-mark.png")
    page.close()
