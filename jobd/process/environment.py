"""The environment a handler gets: a small inherited base, never the daemon's whole one (its
queue's ``env`` and its job's own variables come on top: ``process.jobenv``)."""

from __future__ import annotations

from collections.abc import Mapping

# What a program needs to find its tools, its home, its locale and its clock. Anything else in
# the daemon's environment (REDIS_PASSWORD, cloud keys, NOTIFY_SOCKET, CREDENTIALS_DIRECTORY…)
# stays with the daemon; a queue passes what its handler needs with `env:`.
INHERITED = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR")
INHERITED_PREFIXES = ("LC_",)
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


def base_environment(environ: Mapping[str, str]) -> dict[str, str]:
    env = {
        name: value
        for name, value in environ.items()
        if name in INHERITED or name.startswith(INHERITED_PREFIXES)
    }
    env.setdefault("PATH", DEFAULT_PATH)
    return env
