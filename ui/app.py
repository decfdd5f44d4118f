"""The page's routes: server-rendered Jinja templates, a stylesheet, a little JavaScript.

=========================================  ==========================================================
route                                      what
=========================================  ==========================================================
``GET /``                                  the run list (``listing``), from the projection
``GET /inbox``                             every pending approval and effect in doubt, across runs
                                           (``inbox``), with the run page's forms
``GET /runs/{run}``                        a run: timeline, version tuple, budgets, effects,
                                           approvals, lineage, operator forms (``runview``)
``GET /runs/{run}/live``                   the part of the run page that changes (fetched by
                                           ``ui.js`` when ``/runs/{run}/events`` says so)
``GET /runs/{run}/events``                 server-sent events: ``changed`` when the run's messages
                                           in the stream change
``GET /runs/{run}/steps/{step}``           one step in full, its model messages as a conversation
``GET /diff/{parent}/{branch}``            a fork against its parent, from the fork
``GET /matrix``                            the counterfactual matrix (``?class=ID``: one class's runs)
``GET /failures``                          the classes of failure, each opening its matrix
``POST /runs/{run}/approvals/{request}``   approve or deny, then resume (``actions``)
``POST /effects/resolve``                  settle an in-doubt effect, then resume (``actions``)
``POST /runs/{run}/rerun/plan``            the plan of a re-run; ``POST /runs/{run}/rerun`` queues it
``GET|POST /prices``                       the price table
``GET|POST /signin``, ``POST /signout``    a role's credentials file (secure servers)
=========================================  ==========================================================

Every request passes ``Page.handle``: the Host header must name the loopback address when the page
is bound to it (a page on 127.0.0.1 reached through another name is a DNS-rebinding attempt), a
POST must carry the session's CSRF token and come from the page's own origin, and an operator
action needs a role that may act (``viewers``). Each response carries ``Server-Timing: app;dur=ms``,
the time spent in the handler (``bench/ui.py`` reads it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from runledger.errors import ConfigurationError, LedgerError, RunNotFoundError
from runledger.log.client import LedgerClient, connect
from runledger.log.reader import subject_counts
from runledger.log.subjects import any_agent_run_subject, run_filter
from runledger.ops.trace import continue_command, started_labels
from runledger.projections.failures import check_class_id
from runledger.sandbox.plan import ACTION_TEXT
from runledger.ui import actions, render
from runledger.ui.failures import failures_view
from runledger.ui.inbox import inbox
from runledger.ui.listing import SORTS, STATUSES, RunFilter, run_page
from runledger.ui.matrix import matrix_view
from runledger.ui.prices import PriceTable
from runledger.ui.projection import ProjectionFollower
from runledger.ui.runview import diff_view, read_run, run_view, step_view
from runledger.ui.timeline import bar_rows
from runledger.ui.viewers import COOKIE, Session, SessionStore, Viewer, csrf_ok, sign_in

logger = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
LIVE_POLL_S = 0.5


@dataclass(frozen=True)
class UIConfig:
    nats_url: str
    db: Path
    creds: str | None = None  # the page's own connection; given: a secure server, visitors sign in
    agents: tuple[str, ...] = ()  # MODULE:ATTR of agents the page may resume after a decision
    prices: Path | None = None  # a JSON price table loaded into model_prices at start
    host: str = "127.0.0.1"

    @property
    def secure(self) -> bool:
        return self.creds is not None

    @property
    def loopback(self) -> bool:
        return self.host in LOOPBACK_NAMES or self.host.startswith("127.")


@dataclass
class Context:
    request: Request
    session: Session
    viewer: Viewer
    form: dict[str, str]


Handler = Callable[[Context], Awaitable[Response]]


class Page:
    """The app's state: its own connection, the projection, the sessions, the templates."""

    def __init__(self, config: UIConfig) -> None:
        self.config = config
        self.sessions = SessionStore()
        self.resumer = actions.Resumer(list(config.agents))
        self.env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(["html"]))
        self.env.filters.update(render.FILTERS)
        self.env.globals.update(statuses=STATUSES, sorts=SORTS, quote=quote, action_text=ACTION_TEXT, bar_rows=bar_rows)
        self.client: LedgerClient | None = None
        self.follower: ProjectionFollower | None = None

    # -- lifecycle ----------------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self.client = await connect(self.config.nats_url, user_credentials=self.config.creds)
        self.follower = ProjectionFollower(self.client, self.config.db)
        try:
            await self.follower.start()
            if self.config.prices is not None:
                await self.load_prices(PriceTable.from_file(self.config.prices))
            yield
        finally:
            await self.resumer.close()
            await self.sessions.close()
            await self.follower.close()
            await self.client.close()

    async def load_prices(self, table: PriceTable) -> None:
        for model, price in table.prices.items():
            await self.projection.query(
                "INSERT OR REPLACE INTO model_prices VALUES (?, ?, ?)", [model, price.input, price.output]
            )

    @property
    def projection(self) -> ProjectionFollower:
        assert self.follower is not None, "the page has not started"
        return self.follower

    async def prices(self) -> PriceTable:
        result = await self.projection.query("SELECT model, usd_per_1m_input, usd_per_1m_output FROM model_prices")
        return PriceTable.from_rows(result.rows)

    # -- every request ---------------------------------------------------------------------------------

    def host_ok(self, request: Request) -> bool:
        if not self.config.loopback:
            return True
        host = request.headers.get("host", "")
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        return name in LOOPBACK_NAMES

    def origin_ok(self, request: Request) -> bool:
        origin = request.headers.get("origin") or request.headers.get("referer")
        if not origin or origin == "null":
            return origin is None  # a form posted from a sandboxed or file page sends "null"
        parts = urlsplit(origin)
        return parts.netloc == request.headers.get("host", "")

    def viewer_of(self, session: Session) -> Viewer | None:
        if session.viewer is not None:
            return session.viewer
        if self.config.secure:
            return None
        assert self.client is not None
        return Viewer("local", "local", self.client)

    def route(self, handler: Handler, *, acting: bool = False, signed_in: bool = True) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            started = time.perf_counter()
            response, session, new = await self.handle(request, handler, acting=acting, signed_in=signed_in)
            if new:
                response.set_cookie(COOKIE, session.id, httponly=True, samesite="strict", path="/")
            response.headers["Server-Timing"] = f"app;dur={(time.perf_counter() - started) * 1000:.2f}"
            response.headers.setdefault("Cache-Control", "no-store")
            response.headers["X-Frame-Options"] = "DENY"
            return response

        return endpoint

    async def handle(
        self, request: Request, handler: Handler, *, acting: bool, signed_in: bool
    ) -> tuple[Response, Session, bool]:
        existing = self.sessions.get(request.cookies.get(COOKIE))
        session = existing or self.sessions.new()
        if not self.host_ok(request):
            return PlainTextResponse("this page answers on the loopback address only", 400), session, False
        form: dict[str, str] = {}
        if request.method == "POST":
            form = dict(parse_qsl((await request.body()).decode("utf-8", "replace"), keep_blank_values=True))
            if existing is None or not csrf_ok(session, form.get("csrf")) or not self.origin_ok(request):
                return self.error(session, 403, "refused: the form is stale or came from another site; reload the page "
                                  "and try again"), session, existing is None  # fmt: skip
        viewer = self.viewer_of(session)
        if viewer is None:
            if signed_in:
                return RedirectResponse("/signin", 303), session, existing is None
            assert self.client is not None
            viewer = Viewer("", "nobody", self.client)  # the sign-in page: reads nothing
        if acting and not viewer.can_act:
            return self.error(session, 403, f"the {viewer.role} role may read but not act (approve, resolve, "
                              "re-run, set prices): sign in as an operator"), session, existing is None  # fmt: skip
        try:
            response = await handler(Context(request, session, viewer, form))
        except RunNotFoundError as exc:
            response = self.error(session, 404, str(exc))
        except LedgerError as exc:
            response = self.error(session, 400, str(exc))
        return response, session, existing is None

    # -- rendering --------------------------------------------------------------------------------------

    def html(self, template: str, ctx: Context | Session, code: int = 200, **values: Any) -> HTMLResponse:
        session = ctx.session if isinstance(ctx, Context) else ctx
        viewer = ctx.viewer if isinstance(ctx, Context) else session.viewer
        flash, session.flash = session.flash, []
        text = self.env.get_template(template).render(
            viewer=viewer, csrf=session.csrf, flash=flash, secure=self.config.secure,
            projection_error=self.follower.error if self.follower else None, **values,
        )  # fmt: skip
        return HTMLResponse(text, code)

    def error(self, session: Session, status: int, message: str) -> HTMLResponse:
        return self.html("error.html", session, status, status=status, message=message)

    @staticmethod
    def back(url: str) -> RedirectResponse:
        return RedirectResponse(url, 303)

    # -- pages ------------------------------------------------------------------------------------------

    async def runs(self, ctx: Context) -> Response:
        f = RunFilter.from_query(ctx.request.query_params)
        page = await run_page(self.projection, ctx.viewer, f)
        return self.html("runs.html", ctx, page=page, f=f)

    async def inbox(self, ctx: Context) -> Response:
        box = await inbox(self.projection, ctx.viewer)
        resumes_any = any(self.resumer.can_resume(r.agent) for r in box.runs)
        return self.html("inbox.html", ctx, box=box, resumes_any=resumes_any)

    @staticmethod
    def after(ctx: Context, url: str) -> RedirectResponse:
        """Back to the inbox when the form came from it (the one other place allowed: never a URL the
        form names), else to ``url``."""
        return RedirectResponse("/inbox" if ctx.form.get("back") == "/inbox" else url, 303)

    async def run(self, ctx: Context) -> Response:
        view = await run_view(self.projection, ctx.viewer, await self.prices(), ctx.request.path_params["run"])
        fork = ctx.request.query_params.get("fork", "")  # a step page's "fork here": the re-run form from that step
        fork_step = int(fork) if fork.isdigit() and int(fork) <= view.cp.last_step + 1 else None
        return self.html("run.html", ctx, view=view, cp=view.cp, fork_step=fork_step, **self._forms(view.cp))

    async def resume(self, ctx: Context) -> Response:
        """Resume a run that can go on now (``RunView.resumable``) with the agent the page was given, as
        ``runledger resume`` does (a branch: queued for a sandbox). Refused, saying why, otherwise."""
        run_id = ctx.request.path_params["run"]
        view = await run_view(self.projection, ctx.viewer, await self.prices(), run_id)
        if view.resumable is None:
            raise ConfigurationError(f"run {run_id} is {view.status}: nothing to resume now"
                                     + (" (an operator retries a failed run: `runledger retry`)"
                                        if view.cp.failure_retryable else ""))  # fmt: skip
        if view.graph_thread:
            raise ConfigurationError(f"run {run_id} is a LangGraph thread's: continue it with {view.continue_with}")
        if not self.resumer.resume_later(ctx.viewer.client, run_id, view.cp.agent):
            raise ConfigurationError(
                f"the page has no agent to resume {view.cp.agent!r} with: start it with `runledger ui --agent "
                f"MODULE:ATTR`, or continue it with {view.continue_with}"
            )
        ctx.session.flash.append(f"resuming {run_id}: {view.resumable}")
        return self.back(f"/runs/{run_id}")

    async def run_live(self, ctx: Context) -> Response:
        view = await run_view(self.projection, ctx.viewer, await self.prices(), ctx.request.path_params["run"])
        return self.html("_live.html", ctx, view=view, cp=view.cp, **self._forms(view.cp))

    def _forms(self, cp: Any) -> dict[str, Any]:
        outcome = self.resumer.results.get(cp.run_id)
        return {"resumes": self.resumer.can_resume(cp.agent), "agent_ref": self.resumer.refs.get(cp.agent, ""),
                "modes": actions.MODES, "resume_error": outcome if isinstance(outcome, str) else None}  # fmt: skip

    async def run_events(self, ctx: Context) -> Response:
        run_id = ctx.request.path_params["run"]
        viewer = ctx.viewer
        subjects = run_filter(viewer.agent, run_id) if viewer.agent else any_agent_run_subject(run_id)
        try:
            last = int(ctx.request.query_params.get("since", "0"))
        except ValueError:
            last = 0

        async def stream() -> AsyncIterator[str]:
            nonlocal last
            quiet = 0.0
            yield "retry: 2000\n\n"
            while True:
                try:
                    count = sum((await subject_counts(viewer.client, subjects)).values())
                except (LedgerError, TimeoutError) as exc:
                    logger.debug("live updates of %s: %s", run_id, exc)
                    count = last
                if count != last:
                    last, quiet = count, 0.0
                    yield f"event: changed\ndata: {count}\n\n"
                elif quiet >= 15:
                    quiet = 0.0
                    yield ": still here\n\n"
                await asyncio.sleep(LIVE_POLL_S)
                quiet += LIVE_POLL_S

        return StreamingResponse(stream(), media_type="text/event-stream", headers={"X-Accel-Buffering": "no"})

    async def step(self, ctx: Context) -> Response:
        run_id, number = ctx.request.path_params["run"], ctx.request.path_params["step"]
        log, cp = await read_run(ctx.viewer, run_id)
        view = step_view(log, cp, number, await self.prices())
        if view is None:
            return self.error(ctx.session, 404, f"run {run_id} has no step {number}")
        return self.html("step.html", ctx, view=view, s=view.step)

    async def matrix(self, ctx: Context) -> Response:
        q = ctx.request.query_params
        failure_class = q.get("class", "").strip()
        if failure_class:  # the matrix of one class of failure's runs (the Failures page links it)
            check_class_id(failure_class)
        view = await matrix_view(self.projection, ctx.viewer, q.get("agent", "").strip(), q.get("status", ""),
                                 failure_class=failure_class)  # fmt: skip
        return self.html("matrix.html", ctx, view=view)

    async def failures(self, ctx: Context) -> Response:
        agent = ctx.request.query_params.get("agent", "").strip()
        classes = await failures_view(self.projection, ctx.viewer, agent)
        return self.html("failures.html", ctx, classes=classes, agent=agent)

    async def diff(self, ctx: Context) -> Response:
        params = ctx.request.path_params
        view = await diff_view(ctx.viewer, await self.prices(), params["parent"], params["branch"])
        return self.html("diff.html", ctx, view=view, d=view.diff)

    # -- operator actions -----------------------------------------------------------------------------------

    async def decide(self, ctx: Context) -> Response:
        run_id, request_id = ctx.request.path_params["run"], ctx.request.path_params["request"]
        approved = ctx.form.get("decision") == "approve"
        by = ctx.form.get("by", "").strip()
        if not by:
            raise ConfigurationError("say who decides: fill in your name")
        log, cp = await read_run(ctx.viewer, run_id)
        await actions.decide(ctx.viewer.client, run_id, request_id, by=by, approved=approved,
                             reason=ctx.form.get("reason", ""))  # fmt: skip
        note = f"{'approved' if approved else 'denied'} {request_id} as {by}"
        if self.resumer.resume_later(ctx.viewer.client, run_id, cp.agent):
            note += "; resuming the run"
        else:
            note += f"; continue it with {continue_command(run_id, started_labels(log))}"
        ctx.session.flash.append(note)
        return self.after(ctx, f"/runs/{quote(run_id)}")

    async def resolve(self, ctx: Context) -> Response:
        form = ctx.form
        outcome = form.get("outcome")
        if outcome not in ("committed", "not_committed"):
            raise ConfigurationError("say what happened: committed or not committed")
        text = form.get("result", "").strip()
        try:
            result = json.loads(text) if text else None
        except ValueError as exc:
            raise ConfigurationError(f"the result is not valid JSON: {exc}") from exc
        state = await actions.resolve(
            ctx.viewer.client, form.get("key", ""), agent=form.get("agent") or None, committed=outcome == "committed",
            by=form.get("by", ""), reason=form.get("reason", ""), result=result, force=form.get("force") == "on",
        )  # fmt: skip
        note = f"effect {state.key} resolved as {outcome.replace('_', ' ')} (now {state.status})"
        # The run to resume is the one the key's record names (its claim), under the agent that run's own
        # record names: never the form's, which a page could point at any run or agent.
        run_id = state.run_id
        if run_id:
            log, cp = await read_run(ctx.viewer, run_id)
            if self.resumer.resume_later(ctx.viewer.client, run_id, cp.agent):
                note += "; resuming the run"
            else:
                note += f"; continue it with {continue_command(run_id, started_labels(log))}"
        ctx.session.flash.append(note)
        return self.after(ctx, f"/runs/{quote(run_id)}" if run_id else "/")

    async def rerun_plan(self, ctx: Context) -> Response:
        run_id = ctx.request.path_params["run"]
        request = actions.rerun_request(run_id, ctx.form)
        _, parent = await read_run(ctx.viewer, run_id)
        plan = actions.plan_rerun(parent, request)
        return self.html("rerun_plan.html", ctx, plan=plan, form=ctx.form, cp=parent)

    async def rerun(self, ctx: Context) -> Response:
        run_id = ctx.request.path_params["run"]
        request = actions.rerun_request(run_id, ctx.form, ctx.form.get("request_id") or None)
        _, parent = await read_run(ctx.viewer, run_id)
        plan = actions.plan_rerun(parent, request)
        if not plan.ok:
            return self.html("rerun_plan.html", ctx, 400, plan=plan, form=ctx.form, cp=parent)
        await actions.queue_rerun(ctx.viewer.client, request)
        ctx.session.flash.append(f"queued re-run {request.request_id}: its branch will be {request.branch_run_id} "
                                 "once a worker (`runledger worker`) takes it")  # fmt: skip
        return self.back(f"/runs/{quote(run_id)}")

    async def prices_page(self, ctx: Context) -> Response:
        return self.html("prices.html", ctx, prices=await self.prices())

    async def set_price(self, ctx: Context) -> Response:
        model = ctx.form.get("model", "").strip()
        try:
            price_in, price_out = float(ctx.form.get("input", "")), float(ctx.form.get("output", ""))
        except ValueError as exc:
            raise ConfigurationError("prices are numbers: USD per million input and output tokens") from exc
        if not model or price_in < 0 or price_out < 0:
            raise ConfigurationError("name the model and give non-negative prices")
        if ctx.form.get("remove") == "on":
            await self.projection.query("DELETE FROM model_prices WHERE model = ?", [model])
        else:
            await self.projection.query("INSERT OR REPLACE INTO model_prices VALUES (?, ?, ?)",
                                        [model, price_in, price_out])  # fmt: skip
        return self.back("/prices")

    # -- signing in ---------------------------------------------------------------------------------------

    async def signin_page(self, ctx: Context) -> Response:
        return self.html("signin.html", ctx, url=self.config.nats_url)

    async def signin(self, ctx: Context) -> Response:
        if not self.config.secure:
            return self.back("/")
        viewer = await sign_in(self.config.nats_url, ctx.form.get("credentials", ""))
        await self.sessions.sign_out(ctx.session)  # a fresh CSRF token for the new identity
        ctx.session.viewer = viewer
        ctx.session.flash.append(f"signed in as {viewer.user} ({viewer.role})")
        return self.back("/")

    async def signout(self, ctx: Context) -> Response:
        await self.sessions.sign_out(ctx.session)
        return self.back("/signin" if self.config.secure else "/")


def create_app(config: UIConfig) -> Starlette:
    page = Page(config)
    r = page.route
    routes = [
        Route("/", r(page.runs), methods=["GET"]),
        Route("/inbox", r(page.inbox), methods=["GET"]),
        Route("/runs/{run}", r(page.run), methods=["GET"]),
        Route("/runs/{run}/live", r(page.run_live), methods=["GET"]),
        Route("/runs/{run}/events", r(page.run_events), methods=["GET"]),
        Route("/runs/{run}/steps/{step:int}", r(page.step), methods=["GET"]),
        Route("/diff/{parent}/{branch}", r(page.diff), methods=["GET"]),
        Route("/matrix", r(page.matrix), methods=["GET"]),
        Route("/failures", r(page.failures), methods=["GET"]),
        Route("/runs/{run}/approvals/{request}", r(page.decide, acting=True), methods=["POST"]),
        Route("/effects/resolve", r(page.resolve, acting=True), methods=["POST"]),
        Route("/runs/{run}/rerun/plan", r(page.rerun_plan, acting=True), methods=["POST"]),
        Route("/runs/{run}/rerun", r(page.rerun, acting=True), methods=["POST"]),
        Route("/runs/{run}/resume", r(page.resume, acting=True), methods=["POST"]),
        Route("/prices", r(page.prices_page), methods=["GET"]),
        Route("/prices", r(page.set_price, acting=True), methods=["POST"]),
        Route("/signin", r(page.signin_page, signed_in=False), methods=["GET"]),
        Route("/signin", r(page.signin, signed_in=False), methods=["POST"]),
        Route("/signout", r(page.signout, signed_in=False), methods=["POST"]),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(routes=routes, lifespan=page.lifespan)
    app.state.page = page
    return app
