"""Every problem of a config file, found in one run over the parsed document, before anything
is built (``config.load``: parse → check → build).

In order: ``${VAR}``s that did not expand and the schema's findings (``config_view``), then
what a schema cannot express: each queue's settings (``queue_checks``), the queues against each
other (``cross_queue``), their chains (``chains``), and the ``redis`` and ``dashboard``
sections (here: one server, a URL that reads as written, secrets that can be read, TLS only
where supported, a token for actions). A check that needs a value the schema refused is
skipped; all others run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from jobd.config import convert
from jobd.config.chains import chain_problems
from jobd.config.cross_queue import cross_queue_problems
from jobd.config.problems import Problem
from jobd.config.queue_checks import queue_problems
from jobd.config.queue_settings import QueueSettings
from jobd.config.view import ConfigView, Unchecked, run_checks
from jobd.config.yamlsrc import Path

SERVERS = ("url", "embedded", "cluster", "sentinel")  # where Redis is: one of these, or none

SectionCheck = Callable[[ConfigView], list[Problem]]


def check(view: ConfigView, queues: Mapping[str, QueueSettings]) -> list[Problem]:
    """Every problem of the file: ``view``'s own, then those of its settings."""
    problems = list(view.problems)
    for q in queues.values():
        problems += queue_problems(q)
    problems += cross_queue_problems(list(queues.values()), view, _on_a_cluster(view))
    named = view.data.get("queues")
    problems += chain_problems(queues, [str(n) for n in named] if isinstance(named, dict) else [])
    return problems + run_checks(SECTION_CHECKS, view)


def _on_a_cluster(view: ConfigView) -> bool:
    try:
        return view.has(("redis", "cluster"))
    except Unchecked:  # redis is no mapping: no cluster, as far as the queues know
        return False


def _one_server(view: ConfigView) -> list[Problem]:
    where = [key for key in SERVERS if view.has(("redis", key))]
    if len(where) < 2:
        return []
    message = f"give one of redis.{', redis.'.join(where)}, not several"
    return [view.problem(("redis", where[1]), message)]


def _readable_url(view: ConfigView) -> list[Problem]:
    url = view.get(("redis", "url"), None)
    try:
        if url is not None:
            convert.url(url)
    except convert.Invalid as exc:
        return [view.problem(("redis", "url"), str(exc))]
    return []


def _secret_problems(view: ConfigView, section: Path, name: str) -> list[Problem]:
    try:
        view.secret(section, name)
    except convert.Invalid as exc:
        return [view.problem((*section, str(exc.key)), str(exc))]
    return []


def _password(view: ConfigView) -> list[Problem]:
    return _secret_problems(view, ("redis",), "password")


def _sentinel_password(view: ConfigView) -> list[Problem]:
    if not view.has(("redis", "sentinel")):
        return []
    return _secret_problems(view, ("redis", "sentinel"), "password")


def _tls(view: ConfigView) -> list[Problem]:
    tls = view.get(("redis", "tls"), {})
    if not tls or not (view.has(("redis", "cluster")) or view.has(("redis", "sentinel"))):
        return []
    message = (
        "TLS is supported with redis.url (rediss://) only, not yet with a cluster or "
        "Sentinel; reach those over a private network or a TLS tunnel"
    )
    return [view.problem(("redis", "tls"), message)]


def _dashboard(view: ConfigView) -> list[Problem]:
    try:
        token = view.secret(("dashboard",), "token")
    except convert.Invalid as exc:
        return [view.problem(("dashboard", str(exc.key)), str(exc))]
    if view.get(("dashboard", "actions"), False) and not token:
        message = "actions need a token: set dashboard.token_file or dashboard.token_credential"
        return [view.problem(("dashboard", "actions"), message)]
    return []


SECTION_CHECKS: tuple[SectionCheck, ...] = (
    _one_server,
    _readable_url,
    _password,
    _tls,
    _sentinel_password,
    _dashboard,
)
