"""The read-only web dashboard at ``/ui`` (DESIGN.md section 9; README "Metrics and
dashboard").

Server-side Jinja2 templates, made live by htmx (a committed copy of ``htmx.min.js``, 2.x,
BSD-0): each page holds a live element that asks for its fragment again (the overview every
:data:`POLL_S`, a workload's page every :data:`REFRESH_S`) with the version it shows; an
unchanged fragment is answered 204 and htmx swaps nothing, a changed one replaces the
element. The overview is rendered once for all open pages, again as soon as the service's
change token or its events move and otherwise every :data:`REFRESH_S` (live figures), so a
submit or a cancel shows within about half a second plus one render, without a reload
(``bench/metrics.py`` measures it in Chromium). No JavaScript build step, nothing to fetch
at install or run time, and every figure is rendered by the same Python that serves the API.

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
import math
import pwd
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import parse_qs

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from markupsafe import Markup

from fgpu import states
from fgpu.rules.errors import BadRequest, NotFoundError, ServiceError
from fgpu.server.dashboard.logtail import tail_chunks
from fgpu.server.dashboard.sessions import (
    SESSION_LIFETIME_S,
    new_session,
    session_valid,
)
from fgpu.wire import EventView, GpuHolder, NodeView

if TYPE_CHECKING:
    from fgpu.server.app import ServiceApi

HERE = Path(__file__).parent
SESSION_COOKIE = "fgpu_session"
REFRESH_S = 1.0
"""Seconds: the live figures (use, utilization, waiting times) of the overview are at most
this old, and a workload's page asks for its fragment again this often."""
POLL_S = 0.25
"""Seconds: how often the overview asks whether anything changed (an unchanged answer is a
204 without a body; a change shows within about this plus one render)."""
LOG_TAIL_BYTES = 4096
MAX_URL_BYTES = 8192
"""Longest path plus query string a dashboard page answers (its own links are far shorter);
a longer one gets 414 at once."""
PENDING_SHOWN = 50
"""Pending workloads the overview lists (the oldest; the rest are counted): one user's
backlog of thousands must not make every viewer's page megabytes (issue 27)."""
EVENTS_SHOWN = 20

_templates = Jinja2Templates(directory=HERE / "templates")


def user_name(uid: int) -> str:
    """The local user name of ``uid`` (its number where the machine has no such user)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def holder_marks(holder: GpuHolder) -> list[str]:
    """What the GPU map marks on a share, in the words of :mod:`fgpu.states` (also its CSS
    classes): ``paused-by-priority`` while a higher priority holds it back,
    ``waiting-for-share`` while it waits for the next period, ``squeezed`` while workloads
    that squeezed it borrow its compute (issue 17)."""
    marks = []
    if holder.state in (states.PAUSED_BY_PRIORITY, states.WAITING_FOR_SHARE):
        marks.append(holder.state)
    if holder.squeezed_by:
        marks.append(states.SQUEEZED)
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
        self._lock = threading.Lock()

    def latest(self) -> list[EventView]:
        """The last events, newest first."""
        with self._lock:
            return self._latest()

    def _latest(self) -> list[EventView]:
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
    user: str
    milli: int
    width_pct: float
    colour: str
    marks: str
    label: str
    title: str
    memory_pct: float


def share_cell(holder: GpuHolder, queue: str | None) -> ShareCell:
    """The cell of ``holder`` on its GPU's bar; ``queue`` None: not known (drawn grey).
    Its label names the workload and its user (``train alice 0.5``)."""
    marks = holder_marks(holder)
    quota_gib = f"{holder.memory_mib / 1024:.1f}"
    user = user_name(holder.owner_uid) if holder.owner_uid is not None else "?"
    title = (
        f"{holder.name} ({holder.workload_id}) of {user}, queue {queue or '?'}: "
        f"{holder.compute_milli / 10}% compute, {quota_gib} GiB quota"
    )
    label = f"{holder.name} {user} {holder.compute_milli / 1000}"
    if marks:
        title += ", " + ", ".join(marks)
        label += " \u00b7 " + ", ".join(marks)
    used = holder.used_memory_mib or 0
    return ShareCell(
        workload_id=holder.workload_id,
        user=user,
        milli=holder.compute_milli,
        width_pct=holder.compute_milli / 10,
        colour=queue_colour(queue or ""),
        marks=" ".join(marks),
        label=label,
        title=title,
        memory_pct=min(100.0, 100 * used / (holder.memory_mib or 1)),
    )


def _context(service: "ServiceApi", events: list[EventView]) -> dict[str, Any]:
    nodes: list[NodeView] = service.nodes()
    workloads = service.list_workloads()
    queue_of = {w.id: w.queue for w in workloads}
    gpus = [
        (n, g, [share_cell(h, queue_of.get(h.workload_id)) for h in g.holders])
        for n in nodes
        for g in n.gpus
    ]
    pending = [w for w in workloads if w.phase == "pending"]
    return {
        "gpus": gpus,
        "queues": service.list_queues(),
        "pending": pending[:PENDING_SHOWN],
        "pending_more": max(0, len(pending) - PENDING_SHOWN),
        "events": events,
        "now": time.time(),
    }


class _Overview:
    """The overview's rendered fragment, one for every open page: rendered again at once
    when the service's :meth:`change_token` or the events move, else when it is
    :data:`REFRESH_S` old (for the live figures); a poll in between costs a token read and
    a read of the new events."""

    def __init__(self, service: "ServiceApi") -> None:
        self._service = service
        self._events = _RecentEvents(lambda after, limit: service.events(after, limit))
        self._lock = threading.Lock()
        self._token: tuple[object, ...] | None = None
        self._at = -math.inf
        self._body = ""
        self._context: dict[str, Any] = {}

    def current(self) -> tuple[str, dict[str, Any]]:
        """The fragment (HTML) and the context it was rendered from."""
        with self._lock:
            events = self._events.latest()
            token = (self._service.change_token(), events[0].id if events else None)
            now = time.monotonic()
            if token != self._token or now - self._at >= REFRESH_S:
                context = _context(self._service, events)
                self._body = _templates.get_template("overview_body.html").render(context)
                self._token, self._at, self._context = token, now, context
            return self._body, self._context


def _version(body: str) -> str:
    """A short digest of a rendered fragment: the page asks again with it, and an unchanged
    fragment is answered 204 (htmx then swaps nothing)."""
    return hashlib.blake2b(body.encode(), digest_size=8).hexdigest()


def mount_dashboard(app: FastAPI, service: "ServiceApi") -> None:
    """Add the dashboard's routes (``/ui``, ``/ui/login``, ``/ui/static``) to ``app``."""
    from fgpu.log_files import log_end
    from fgpu.server.app import client_key, current_caller, read_from
    from fgpu.server.service import Caller

    async def bounded_url(request: Request) -> None:
        """414 for a URL past :data:`MAX_URL_BYTES` (before anything else is read; in the
        event loop, as :func:`fgpu.server.app.current_caller`)."""
        size = len(request.scope.get("raw_path") or b"") + len(request.scope["query_string"])
        if size > MAX_URL_BYTES:
            reason = f"the URL is {size} bytes, more than the dashboard's {MAX_URL_BYTES}"
            raise HTTPException(414, {"field": "url", "reason": reason})

    bounded = Depends(bounded_url)
    overview_state = _Overview(service)
    env = _templates.env
    env.globals.update(marks=holder_marks, colour=queue_colour, refresh_s=REFRESH_S)
    env.filters["gib"] = lambda mib: f"{(mib or 0) / 1024:.1f}"
    env.filters["user"] = user_name
    env.filters["priority"] = states.priority_word
    env.filters["clock"] = lambda t: time.strftime("%H:%M:%S", time.localtime(t))
    app.mount("/ui/static", StaticFiles(directory=HERE / "static"), name="ui-static")

    def page(request: Request, name: str, context: dict[str, Any]) -> HTMLResponse:
        return _templates.TemplateResponse(request, name, context)

    def wrap(body: str, source: str, every_s: float) -> str:
        """``body`` (a rendered fragment) in the element that asks ``source`` for it again
        every ``every_s``, with the fragment's version."""
        return _templates.get_template("live.html").render(
            source=f"{source}?v={_version(body)}", body=Markup(body), every_s=every_s
        )

    def fragment(body: str, source: str, every_s: float, since: str | None) -> Response:
        """The live element again, or 204 when its fragment is still the version ``since``."""
        if since == _version(body):
            return Response(status_code=204)
        return HTMLResponse(wrap(body, source, every_s))

    @app.get("/ui", include_in_schema=False, dependencies=[bounded, Depends(current_caller)])
    def overview(request: Request) -> Response:
        """The GPU map, queues, pending workloads and recent events."""
        body, context = overview_state.current()
        live = Markup(wrap(body, "/ui/fragment/overview", POLL_S))
        return page(request, "overview.html", {**context, "live": live})

    @app.get(
        "/ui/fragment/overview",
        include_in_schema=False,
        dependencies=[bounded, Depends(current_caller)],
    )
    def overview_fragment(v: str | None = None) -> Response:
        return fragment(overview_state.current()[0], "/ui/fragment/overview", POLL_S, v)

    def workload_context(workload_id: str, caller: Caller) -> dict[str, Any]:
        detail = service.get_workload(workload_id)
        refused: str | None = None
        log: list[tuple[str, str]] = []  # (stream, text), both streams in the order written
        try:
            path = service.log_path(caller, workload_id, "all")
        except BadRequest:  # started before fgpu kept the ordered log: stdout alone
            path = service.log_path(caller, workload_id, "stdout")
            size = log_end(path)
            data, _ = read_from(path, max(0, size - LOG_TAIL_BYTES), LOG_TAIL_BYTES)
            log = [("stdout", data.decode("utf-8", "replace"))]
        except ServiceError as exc:
            refused = exc.reason
        else:
            log = [
                (c.stream, c.data.decode("utf-8", "replace"))
                for c in tail_chunks(path, LOG_TAIL_BYTES)
            ]
        return {
            "w": detail,
            "log": log,
            "log_refused": refused,
            "log_kib": LOG_TAIL_BYTES // 1024,
            "now": time.time(),
        }

    def workload_body(workload_id: str, caller: Caller) -> tuple[str, dict[str, Any]]:
        context = workload_context(workload_id, caller)
        return _templates.get_template("workload_body.html").render(context), context

    @app.get("/ui/workloads/{workload_id}", include_in_schema=False, dependencies=[bounded])
    def workload_page(
        request: Request, workload_id: str, caller: Annotated[Caller, Depends(current_caller)]
    ) -> Response:
        """One workload: request, placement, events, the tail of its log (a dashboard page
        saying so, 404, for an unknown id)."""
        try:
            body, context = workload_body(workload_id, caller)
        except NotFoundError as exc:
            return _templates.TemplateResponse(
                request, "missing.html", {"reason": exc.reason}, status_code=404
            )
        live = Markup(wrap(body, f"/ui/fragment/workloads/{workload_id}", REFRESH_S))
        return page(request, "workload.html", {**context, "live": live})

    @app.get(
        "/ui/fragment/workloads/{workload_id}", include_in_schema=False, dependencies=[bounded]
    )
    def workload_fragment(
        workload_id: str,
        caller: Annotated[Caller, Depends(current_caller)],
        v: str | None = None,
    ) -> Response:
        body = workload_body(workload_id, caller)[0]
        return fragment(body, f"/ui/fragment/workloads/{workload_id}", REFRESH_S, v)

    @app.get("/ui/login", include_in_schema=False, dependencies=[bounded])
    def login_form(request: Request) -> HTMLResponse:
        """Where a browser on the TCP listener types the token once."""
        return page(request, "login.html", {"error": None})

    @app.post("/ui/login", include_in_schema=False)
    async def login(request: Request) -> Response:
        """Check the typed token; set the session cookie (HttpOnly, SameSite=Strict, for
        :data:`~fgpu.server.dashboard.sessions.SESSION_LIFETIME_S`). Wrong tokens count with
        the API's (:mod:`fgpu.server.guesses`, per account and client key: the uid of a
        local client, else the address); a client over the limit gets 429 with
        ``Retry-After`` without its token being looked at."""
        settings = request.app.state.fgpu
        client = client_key(request)
        wait = settings.guesses.check(settings.account, client)
        if wait is not None:
            return _templates.TemplateResponse(
                request,
                "login.html",
                {"error": wait.reason},
                status_code=429,
                headers={"Retry-After": str(wait.seconds)},
            )
        form = parse_qs((await request.body()).decode("utf-8", "replace"))
        given = (form.get("token") or [""])[0].strip().encode()
        if settings.token is None or not hmac.compare_digest(given, settings.token):
            settings.guesses.failed(settings.account, client)
            return _templates.TemplateResponse(
                request, "login.html", {"error": "wrong token"}, status_code=401
            )
        settings.guesses.succeeded(settings.account, client)
        response = RedirectResponse("/ui", status_code=303)
        response.set_cookie(
            SESSION_COOKIE,
            new_session(settings.token),
            max_age=SESSION_LIFETIME_S,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path="/ui",
        )
        return response


__all__ = ["SESSION_COOKIE", "holder_marks", "mount_dashboard", "session_valid"]
