"""The ``hg-dagger`` command. Each module in this package registers its subcommands; commands
parse arguments and call one function. Expected faults print one readable error, never a traceback."""

from __future__ import annotations

import argparse
import errno
import importlib
import logging
import os
import pkgutil
import sys

from pydantic import ValidationError

from hg_dagger import __version__
from hg_dagger.config import format_validation_error
from hg_dagger.errors import HgDaggerError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hg-dagger",
        description="Human-gated DAgger: run a student policy, hand over to a person or an expert when a gate "
        "trips, record correction windows bound to their episodes, and train the next student on them.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except HgDaggerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ValidationError as exc:
        print(f"error: {format_validation_error(args.command, exc)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader of our output went away (`hg-dagger tasks | head -1`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as exc:
        if exc.errno not in _ENVIRONMENT_ERRNOS or args.verbose:
            raise
        print(f"error: {os_error_line(args, exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


# The machine's faults, not the program's: a full disk, a read-only or missing folder, no permission.
_ENVIRONMENT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT,
                       errno.ENOTDIR, errno.EISDIR}
_PATH_OPTIONS = ("out", "store", "file", "checkpoint")  # where a command writes or reads, most likely first


def os_error_line(args: argparse.Namespace, exc: OSError) -> str:
    """One line for an OSError: the file it names, else the command's own output or store path."""
    reason = exc.strerror or str(exc)
    if exc.errno == errno.ENOSPC:
        reason += " (free some space and run the command again)"
    if exc.filename:
        return f"{exc.filename}: {reason}"
    for name in _PATH_OPTIONS:
        value = getattr(args, name, None)
        if isinstance(value, str) and value:
            return f"{args.command} --{name} {value}: {reason}"
    return f"{args.command}: {reason}"


if __name__ == "__main__":
    sys.exit(main())
