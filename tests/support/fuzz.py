"""What the hypothesis properties share: the example budget, pseudonyms as people type them, YAML values, and
the public command run in this process with what it printed.

Budgets are small and the example sequence fixed (derandomized) so the suite runs them in seconds;
HG_DAGGER_FUZZ_EXAMPLES=N runs N random examples per property instead (a long search)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("HG_DAGGER_FUZZ_EXAMPLES", "0"))


def budget(default: int, **kw) -> settings:
    """``default`` derandomized examples, or HG_DAGGER_FUZZ_EXAMPLES random ones."""
    return settings(max_examples=EXAMPLES or default, derandomize=not EXAMPLES, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                           HealthCheck.data_too_large], **kw)


PEOPLE = ("synthetic", "op-a", "rev-1", "rev-2")


def spell(name: str, how: int) -> str:
    """The same pseudonym as a person might type it: other case, spaces around or inside (0-4), or as a
    lookalike (5: fullwidth letters, 6: a zero-width space inside)."""
    return [name, name.upper(), f"  {name.title()} ", name[:2] + " " + name[2:], f"\t{name.swapcase()}",
            "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in name), name[:2] + "\u200b" + name[2:]][how]


SPELLINGS = 7


pseudonym = st.builds(spell, st.sampled_from(PEOPLE), st.integers(0, 4))

yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8)

texts = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"], exclude_characters="\x00"), max_size=12)
"""Any short text a person or a script might pass as an argument (control characters and newlines too)."""


@dataclass
class Ran:
    """One `hg-dagger` command run in this process."""

    code: int
    out: str
    err: str

    @property
    def error_lines(self) -> list[str]:
        return [ln for ln in self.err.splitlines() if "error:" in ln]

    def refused(self) -> str:
        """The one line of a refusal (exit 2, no traceback): the line itself."""
        assert self.code == 2, (self.code, self.out, self.err)
        assert "Traceback" not in self.err + self.out, self.err
        lines = self.error_lines
        assert len(lines) == 1, self.err
        return lines[0]


def run_cli(capsys, *argv) -> Ran:
    """`hg-dagger ARGV` through cli.main in this process; a usage error (argparse's exit) is exit 2 as in a shell.
    Anything else raised is left to fail the test: that is a traceback a user would see."""
    from hg_dagger.cli import main

    capsys.readouterr()
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 2
    got = capsys.readouterr()
    return Ran(int(code), got.out, got.err)
