"""Errors for expected faults. The CLI prints them as one readable line; they never end in a traceback."""


class HgDaggerError(Exception):
    """An expected fault with a message meant for a person (names the file, episode, field or key)."""


class ConfigError(HgDaggerError):
    """A configuration file or value is invalid."""


class ContractError(HgDaggerError):
    """Data does not satisfy the correction-data contract."""


class StoreError(HgDaggerError):
    """An episode store is missing, corrupt, or of an unsupported schema version."""


class EnvError(HgDaggerError):
    """An environment, task or mapping is unknown or misused (e.g. a malformed action)."""


def failure_reason(exc: BaseException) -> str:
    """Why an I/O call failed, in one line: the OS's words and the file, else the exception's type and text."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror + (f": {exc.filename}" if exc.filename else "")
    return f"{type(exc).__name__}: {exc}"


class PolicyError(HgDaggerError):
    """A policy cannot be opened, or stopped answering: a server that is unreachable, died, stalled, answered
    with an error or with an unusable action. The message names the policy (its server's address)."""
