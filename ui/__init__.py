"""runledger's page: ``runledger ui``, a local web app over the projection and the log.

Needs the ``ui`` extra (``pip install 'runledger[ui]'``: Starlette, uvicorn, Jinja2). The cut:

- ``cli``: the ``ui`` sub-command (registered through the ``runledger.commands`` entry point).
- ``server``: binds the socket (loopback by default) and serves ``app`` with uvicorn.
- ``app``: the routes; pages are server-rendered Jinja templates (``templates/``) with a little
  JavaScript (``static/ui.js``: live updates over server-sent events, the sign-in file reader).
- ``viewers``: who is looking (sessions, sign-in with a role's credentials file, what a role may
  do, CSRF tokens).
- ``projection``: the page's DuckDB projection, kept current by following the stream.
- ``listing``: the run list (filters, sorting, paging, search over content the viewer may read).
- ``timeline``: a run's steps laid out on a time axis.
- ``render``: values as the page shows them (pretty JSON, redaction tokens, sealed content).
- ``prices``: the price table and what runs, steps and diffs cost.
- ``actions``: operator actions, through the same functions as the CLI.

The package imports nothing of itself here: ``runledger ui`` must be able to say which extra is
missing before Starlette is imported.
"""
