"""Secret values for the workers' environment, and how an environment is shown. Pure.

`job.secret_env` names variables whose values come from the controller's own environment when
a run starts (or a supervisor restarts it): they travel to each host in the launch request on
standard input and live only in the environment of the host's supervisor and worker, never in
the inventory, the run record, a spec file, a log or a status. Whatever the product prints of an
environment goes through `shown_env`, which also hides values of keys that look like secrets.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from orchestrator.errors import SecretMissing

REDACTED = "[redacted]"
SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")


def looks_secret(name: str) -> bool:
    upper = name.upper()
    return any(word in upper for word in SECRET_WORDS)


def missing_secrets(names: Iterable[str], environ: Mapping[str, str]) -> list[str]:
    return [name for name in names if name not in environ]


def secret_values(
    names: Iterable[str], environ: Mapping[str, str], *, doing: str
) -> dict[str, str]:
    """The values of `names` in `environ`; SecretMissing naming every absent one."""
    names = tuple(names)
    missing = missing_secrets(names, environ)
    if missing:
        raise SecretMissing(
            f"job.secret_env: {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not "
            f"set in this shell's environment, and {doing} needs "
            f"{'its value' if len(missing) == 1 else 'their values'}",
            hint=f"export {' '.join(missing)} here (the values are never written down), "
            "then run the command again",
        )
    return {name: environ[name] for name in names}


def shown_env(env: Mapping[str, str], secret_names: Iterable[str] = ()) -> dict[str, str]:
    """The environment as the product prints it: secret values replaced by [redacted]."""
    hidden = set(secret_names)
    return {
        key: REDACTED if key in hidden or looks_secret(key) else value for key, value in env.items()
    }


def scrub(text: str, values: Iterable[str]) -> str:
    """`text` with every occurrence of a secret value replaced (a script that printed one)."""
    for value in sorted({v for v in values if len(v) >= 4}, key=len, reverse=True):
        text = text.replace(value, REDACTED)
    return text
