"""The read-only web dashboard at ``/ui`` (DESIGN.md section 9; ``docs/dashboard.md``).

Server-side Jinja2 templates, made live by htmx (a committed copy of ``htmx.min.js``, 2.x,
BSD-0): each page holds a fragment that htmx fetches again every second and swaps in, so a
change shows within about 1 s without a reload. No JavaScript build step, nothing to fetch at
install or run time, and every figure is rendered by the same Python that serves the API.

Authorization is the API's: every route depends on :func:`fgpu.server.app.current_caller`
(peer uid on the Unix socket; on TCP the bearer token, or the dashboard's session cookie,
which :func:`login` sets after the token was typed once and which is accepted only for
``GET`` requests under ``/ui``). What the API keeps private stays private: a workload's log
tail is shown only to its owner and admins, as ``GET /v1/workloads/{id}/logs``.
"""

# no ``from __future__ import annotations``: the routes' annotations name the caller
# dependency, imported inside mount_dashboard, and FastAPI reads them at definition time
import hashlib
import hmac
import time
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import parse_qs

from fastapi import Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from markupsafe import Markup

from fgpu.rules.errors import ServiceError
from fgpu.wire import EventView, GpuHolder, NodeView

if TYPE_CHECKING:
    from fgpu.server.app import ServiceApi

HERE = Path(__file__).parent
SESSION_COOKIE = "fgpu_session"
REFRESH_S = 1.0
"""How often a page fetches its fragment again (seconds); changes show within about this."""
LOG_TAIL_BYTES = 4096
EVENTS_SHOWN = 20

_templates = Jinja2Templates(directory=HERE / "templates")


def session_value(token: bytes) -> str:
    """The session cookie's value for ``token``: an HMAC of a fixed label under the token,
    so the cookie proves the token was typed without being usable as the bearer token."""
    return hmac.new(token, b"fgpu dashboard session", hashlib.sha256).hexdigest()


def holder_marks(holder: GpuHolder) -> list[str]:
    """What the GPU map marks on a share: ``paused`` while a higher priority holds it back
    (the governor's ``frozen-by-priority``), ``time-sliced`` while it waits for its turn.
    One place to add new marks (a squeezed workload, issue 17)."""
    marks = []
    if holder.state == "frozen-by-priority":
        marks.append("paused")
    if getattr(holder, "squeezed", False):
        marks.append("squeezed")
    return marks


def queue_colour(queue: str) -> str:
    """A stable colour per queue (CSS ``hsl``), from a CRC of its name."""
    hue = zlib.crc32(queue.encode()) % 360
    return f"hsl({hue} 60% 55%)"


class _RecentEvents:
    """The last :data:`EVENTS_SHOWN` events, followed by a cursor (one read of the whole
    history at the first page, then only what is new)."""

    def __init__(self, read: Callable[[int | None, int], list[EventView]]) -> None:
        self._read = read
        self._after: int | None = None
        self._events: deque[EventView] = deque(maxlen=EVENTS_SHOWN)

    def latest(self) -> list[EventView]:
        while True:
            batch = self._read(self._after, 10_000)
            if not batch:
                break
            self._events.extend(batch)
            self._after = batch[-1].id
            if len(batch) < 10_000:
                break
        return list(reversed(self._events))


@dataclass(frozen=True, slots=True)
class ShareCell:
    """One workload's share of a GPU bar, its texts prepared once (the bar of a busy fleet
    has a thousand of them; the template only prints)."""

    workload_id: str
    milli: int
    width_pct: float
    colour: str
    marks: str
    label: str
    title: str
    memory_pct: float


def share_cell(holder: GpuHolder, queue: str | None) -> ShareCell:
    """The cell of ``holder`` on its GPU's bar; ``queue`` None: not known (drawn grey)."""
    marks = holder_marks(holder)
    quota_gib = f"{holder.memory_mib / 1024:.1f}"
    title = (
        f"{holder.name} ({holder.workload_id}) queue {queue or '?'}: "
        f"{holder.compute_milli / 10}% compute, {quota_gib} GiB quota"
    )
    label = f"{holder.name} {holder.compute_milli / 1000}"
    if marks:
        title += ", " + ", ".join(marks)
        label += " \u00b7 " + ", ".join(marks)
    used = holder.used_memory_mib or 0
    return ShareCell(
        workload_id=holder.workload_id,
        milli=holder.compute_milli,
        width_pct=holder.compute_milli / 10,
        colour=queue_colour(queue or ""),
        marks=" ".join(marks),
        label=label,
        title=title,
        memory_pct=min(100.0, 100 * used / (holder.memory_mib or 1)),
    )


def _context(service: "ServiceApi", events: _RecentEvents) -> dict[str, Any]:
    nodes: list[NodeView] = service.nodes()
    workloads = service.list_workloads()
    queue_of = {w.id: w.queue for w in workloads}
    gpus = [
        (n, g, [share_cell(h, queue_of.get(h.workload_id)) for h in g.holders])
        for n in nodes
        for g in n.gpus
    ]
    return {
        "gpus": gpus,
        "queues": service.list_queues(),
        "pending": [w for w in workloads if w.phase == "pending"],
        "events": events.latest(),
        "now": time.time(),
        "refresh_s": REFRESH_S,
    }


def _version(body: str) -> str:
    """A short digest of a rendered fragment: the page asks again with it, and an unchanged
    fragment is answered 204 (htmx then swaps nothing)."""
    return hashlib.blake2b(body.encode(), digest_size=8).hexdigest()


def mount_dashboard(app: FastAPI, service: "ServiceApi") -> None:
    """Add the dashboard's routes (``/ui``, ``/ui/login``, ``/ui/static``) to ``app``."""
    from fgpu.server.app import current_caller, read_from
    from fgpu.server.service import Caller

    events = _RecentEvents(lambda after, limit: service.events(after, limit))
    env = _templates.env
    env.globals.update(marks=holder_marks, colour=queue_colour, refresh_s=REFRESH_S)
    env.filters["gib"] = lambda mib: f"{(mib or 0) / 1024:.1f}"
    env.filters["clock"] = lambda t: time.strftime("%H:%M:%S", time.localtime(t))
    app.mount("/ui/static", StaticFiles(directory=HERE / "static"), name="ui-static")

    def page(request: Request, name: str, context: dict[str, Any]) -> HTMLResponse:
        return _templates.TemplateResponse(request, name, context)

    def wrap(body: str, source: str) -> str:
        """``body`` (a rendered fragment) in the element that asks ``source`` for it again
        every :data:`REFRESH_S`, with the fragment's version."""
        return _templates.get_template("live.html").render(
            source=f"{source}?v={_version(body)}", body=Markup(body), refresh_s=REFRESH_S
        )

    def fragment(body: str, source: str, since: str | None) -> Response:
        """The live element again, or 204 when its fragment is still the version ``since``."""
        if since == _version(body):
            return Response(status_code=204)
        return HTMLResponse(wrap(body, source))

    def overview_body() -> tuple[str, dict[str, Any]]:
        context = _context(service, events)
        return _templates.get_template("overview_body.html").render(context), context

    @app.get("/ui", include_in_schema=False, dependencies=[Depends(current_caller)])
    def overview(request: Request) -> Response:
        """The GPU map, queues, pending workloads and recent events."""
        body, context = overview_body()
        live = Markup(wrap(body, "/ui/fragment/overview"))
        return page(request, "overview.html", {**context, "live": live})

    @app.get(
        "/ui/fragment/overview", include_in_schema=False, dependencies=[Depends(current_caller)]
    )
    def overview_fragment(v: str | None = None) -> Response:
        return fragment(overview_body()[0], "/ui/fragment/overview", v)

    def workload_context(workload_id: str, caller: Caller) -> dict[str, Any]:
        detail = service.get_workload(workload_id)
        refused: str | None = None
        try:
            path = service.log_path(caller, workload_id, "stdout")
        except ServiceError as exc:
            log, refused = "", exc.reason
        else:
            size = path.stat().st_size if path.exists() else 0
            data, _ = read_from(path, max(0, size - LOG_TAIL_BYTES), LOG_TAIL_BYTES)
            log = data.decode("utf-8", "replace")
        return {"w": detail, "log": log, "log_refused": refused, "now": time.time()}

    def workload_body(workload_id: str, caller: Caller) -> tuple[str, dict[str, Any]]:
        context = workload_context(workload_id, caller)
        return _templates.get_template("workload_body.html").render(context), context

    @app.get("/ui/workloads/{workload_id}", include_in_schema=False)
    def workload_page(
        request: Request, workload_id: str, caller: Annotated[Caller, Depends(current_caller)]
    ) -> Response:
        """One workload: request, placement, events, the tail of its log."""
        body, context = workload_body(workload_id, caller)
        live = Markup(wrap(body, f"/ui/fragment/workloads/{workload_id}"))
        return page(request, "workload.html", {**context, "live": live})

    @app.get("/ui/fragment/workloads/{workload_id}", include_in_schema=False)
    def workload_fragment(
        workload_id: str,
        caller: Annotated[Caller, Depends(current_caller)],
        v: str | None = None,
    ) -> Response:
        body = workload_body(workload_id, caller)[0]
        return fragment(body, f"/ui/fragment/workloads/{workload_id}", v)

    @app.get("/ui/login", include_in_schema=False)
    def login_form(request: Request) -> HTMLResponse:
        """Where a browser on the TCP listener types the token once."""
        return page(request, "login.html", {"error": None})

    @app.post("/ui/login", include_in_schema=False)
    async def login(request: Request) -> Response:
        """Check the typed token; set the session cookie (HttpOnly, SameSite=Strict)."""
        settings = request.app.state.fgpu
        form = parse_qs((await request.body()).decode("utf-8", "replace"))
        given = (form.get("token") or [""])[0].strip().encode()
        if settings.token is None or not hmac.compare_digest(given, settings.token):
            return _templates.TemplateResponse(
                request, "login.html", {"error": "wrong token"}, status_code=401
            )
        response = RedirectResponse("/ui", status_code=303)
        response.set_cookie(
            SESSION_COOKIE,
            session_value(settings.token),
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path="/ui",
        )
        return response


__all__ = ["SESSION_COOKIE", "holder_marks", "mount_dashboard", "session_value"]
