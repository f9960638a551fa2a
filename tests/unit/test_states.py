"""One vocabulary of states (issue 25, point 6; :mod:`fgpu.states`): the words, their order
of precedence, the text ``fgpu ls`` shows, the documentation's table, priorities by name,
event messages in the words of ``fgpu ls`` (:mod:`fgpu.server.eventwords`), and the
dashboard's paused label legible (WCAG AA contrast computed from the CSS)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fgpu import states
from fgpu.sched.workload import PRIORITY_CLASSES
from fgpu.server.eventwords import as_listed

ROOT = Path(__file__).resolve().parents[2]
CSS = ROOT / "src/fgpu/server/dashboard/static/dashboard.css"


def test_priority_classes_are_the_cores() -> None:
    assert states.PRIORITY_CLASSES == PRIORITY_CLASSES


@pytest.mark.parametrize(
    ("priority", "word"),
    [(25, "very-low"), (40, "low"), (50, "normal"), (100, "high"), (125, "critical"), (75, "75")],
)
def test_priority_word(priority: int, word: str) -> None:
    assert states.priority_word(priority) == word


BASE = {
    "phase": "running",
    "stopping": False,
    "squeezed": False,
    "suspended": False,
    "gpu_state": None,
    "preempted_kind": None,
}


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        pytest.param({}, None, id="nothing"),
        pytest.param({"gpu_state": "running"}, None, id="governed-running"),
        pytest.param({"gpu_state": "paused-by-priority"}, "paused-by-priority", id="paused"),
        pytest.param({"gpu_state": "waiting-for-share"}, "waiting-for-share", id="share"),
        pytest.param({"squeezed": True, "gpu_state": "paused-by-priority"}, "squeezed", id="sq"),
        pytest.param({"stopping": True, "squeezed": True}, "stopping", id="stopping-first"),
        pytest.param({"phase": "pending", "suspended": True}, "suspended", id="suspended"),
        pytest.param({"phase": "pending", "preempted_kind": "preemption"}, "preempted", id="pre"),
        pytest.param({"phase": "pending", "preempted_kind": "reclaim"}, "reclaimed", id="rec"),
        pytest.param({"preempted_kind": "reclaim"}, None, id="runs-again"),
    ],
)
def test_workload_state_precedence(fields: dict[str, object], expected: str | None) -> None:
    assert states.workload_state(**{**BASE, **fields}) == expected  # type: ignore[arg-type]
    if expected is not None:
        assert expected in states.STATES


@pytest.mark.parametrize(
    ("state", "kw", "text"),
    [
        ("preempted", {"by": "serve", "restarts": 2}, "preempted by serve (restart 2)"),
        ("reclaimed", {"by": "train", "restarts": 1}, "reclaimed by train (restart 1)"),
        ("preempted", {"restarts": 1}, "preempted (restart 1)"),
        ("squeezed", {"squeezed_by": ["3f2a9c1b"]}, "squeezed by 3f2a9c1b"),
        ("suspended", {"suspended_host_mib": 1536}, "suspended (1.5GiB in host memory)"),
        ("paused-by-priority", {}, "paused-by-priority"),
        (None, {}, ""),
    ],
)
def test_state_text(state: str | None, kw: dict[str, object], text: str) -> None:
    assert states.state_text(state, **kw) == text  # type: ignore[arg-type]


def test_governor_words() -> None:
    assert states.governor_word("frozen-by-priority") == "paused-by-priority"
    assert states.governor_word("frozen-by-share") == "waiting-for-share"
    assert states.governor_word("running") == "running"
    assert states.governor_word(None) is None


def test_the_documented_table_is_the_vocabulary() -> None:
    rows = re.findall(
        r"^\| `([a-z-]+)` \| [^|]+ \| ([^|]+) \|", (ROOT / "docs/states.md").read_text(), re.M
    )
    assert {word: meaning.strip() for word, meaning in rows} == states.STATES


def test_events_read_as_ls() -> None:
    gpus = {"GPU-5e1f0c2a-1111-2222-3333-444455556666": "vm/0"}
    names = {"3f2a9c1b": "serve", "0a0b0c0d": "train"}
    message = "paused: 3f2a9c1b (priority 125) is busy on GPU-5e1f0c2a-1111-2222-3333-444455556666"
    assert as_listed(message, gpus, names) == (
        "paused: serve (3f2a9c1b, priority critical) is busy on vm/0"
    )
    core = "preemption by 0a0b0c0d (queue lab, priority 100) on vm"
    assert as_listed(core, gpus, names) == (
        "preemption by train (0a0b0c0d) (queue lab, priority high) on vm"
    )
    # unknown GPUs and ids, and numbers that are no class, stay as they are
    other = "GPU-ffff on priority 75 by deadbeef"
    assert as_listed(other, gpus, names) == other
    # a workload already named is not named twice
    assert as_listed("serve (3f2a9c1b) ended", gpus, names) == "serve (3f2a9c1b) ended"


# ----------------------------------------------------------------- the paused label
def _rules(css: str) -> dict[str, dict[str, str]]:
    """selector -> declarations, for each selector of each rule (comments dropped)."""
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    found: dict[str, dict[str, str]] = {}
    for selectors, body in re.findall(r"([^{}]+)\{([^}]*)\}", css):
        declarations = dict(
            (k.strip(), v.strip().replace("!important", "").strip())
            for k, v in (d.split(":", 1) for d in body.split(";") if ":" in d)
        )
        for selector in selectors.split(","):
            found.setdefault(" ".join(selector.split()), {}).update(declarations)
    return found


def _luminance(hex_colour: str) -> float:
    """Relative luminance (WCAG 2.1, section 1.4.3 definitions) of ``#rgb``/``#rrggbb``."""
    h = hex_colour.lstrip("#")
    if len(h) == 3:
        h = "".join(c * 2 for c in h)
    assert len(h) == 6, hex_colour

    def channel(c: int) -> float:
        s = c / 255
        return s / 12.92 if s <= 0.03928 else ((s + 0.055) / 1.055) ** 2.4

    r, g, b = (channel(int(h[i : i + 2], 16)) for i in (0, 2, 4))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(a: str, b: str) -> float:
    """WCAG contrast ratio (L1 + 0.05) / (L2 + 0.05)."""
    hi, lo = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def test_contrast_formula() -> None:
    assert contrast("#000", "#fff") == pytest.approx(21.0)
    assert contrast("#777", "#fff") == pytest.approx(4.48, abs=0.01)


@pytest.mark.parametrize("mark", ["paused-by-priority", "waiting-for-share"])
def test_the_paused_label_meets_wcag_aa(mark: str) -> None:
    rules = _rules(CSS.read_text())
    label = rules[f".share.{mark} .label"]
    ratio = contrast(label["color"], label["background"])
    assert ratio >= 4.5, f"{mark} label contrast {ratio:.2f}:1 is below WCAG AA 4.5:1"
    # nothing fades the label: no opacity on the share or the label
    for selector in (f".share.{mark}", f".share.{mark} .label", ".share", ".share .label"):
        assert float(rules.get(selector, {}).get("opacity", "1")) == 1.0, selector
