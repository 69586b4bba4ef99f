"""`hg-dagger review` and `store reviewers` under random sequences of commands (hypothesis): good and bad window
ids (full, prefixes, too short, unknown, other case, garbage), reviewers (the operator respelled, empty, any
text), reasons, rosters. After every command: no traceback; a refused one exits 2 with one `error:` line
naming the window, the reviewer, the reason or the roster, and changes nothing in the store; an accepted
decision is in the window's audit trail afterwards, exactly as made, none lost. Whether a command is accepted
is restated here from docs/review.md and compared.

Budgets are bounded for CI (derandomized, tests/support/fuzz.py); HG_DAGGER_FUZZ_EXAMPLES=300 runs a longer
random search."""

from __future__ import annotations

import json
import shutil
import unicodedata

import pytest
import support.store as sh
from hypothesis import given
from hypothesis import strategies as st
from support.fuzz import PEOPLE, SPELLINGS, budget, run_cli, spell, texts

from hg_dagger.contract import QCResult
from hg_dagger.review.decisions import audit_trail, list_windows
from hg_dagger.store import EpisodeStore

pytestmark = [pytest.mark.subprocess]

OPERATORS = ("op-a", "synthetic", "")  # one episode each; the last has no operator


def _key(name: str) -> str:
    """Two spellings of one person: compatibility forms folded, whitespace and invisible characters dropped."""
    text = unicodedata.normalize("NFKC", name)
    return unicodedata.normalize("NFKC", "".join(c for c in text if not c.isspace()
                                                 and unicodedata.category(c) != "Cf").casefold())


def _visible(name: str) -> bool:
    """One line of visible text (what a pseudonym must be)."""
    return not any(unicodedata.category(c) in ("Cc", "Cf", "Co", "Cn", "Zl", "Zp") for c in name)


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """Three episodes with one correction window each, by the operators above."""
    path = tmp_path_factory.mktemp("fuzz-review") / "store"
    with EpisodeStore.create(path).recorder() as rec:
        for seed, op in enumerate(OPERATORS):
            sh.record(rec, seed, 12, window=(3, 8), operator=op)
    rows = list_windows(path)
    assert [r.operator for r in rows] == list(OPERATORS)
    return path, rows


def _ref(rows, how: int, pick: int, junk: str) -> str:
    wid = rows[pick % len(rows)].window_id
    return [wid, wid.upper(), wid[:8], wid[:12], f" {wid[:10]} ", wid[:5], "0" * 8 + wid[8:], junk, "", "  "][how]


def _resolve(rows, ref: str):
    """The window a reference names, by the documented rule (a full id, or a unique prefix of >= 8 characters,
    in any case, spaces around ignored); None when it names none."""
    key = ref.strip().lower()
    if not key:
        return None
    exact = [r for r in rows if r.window_id == key]
    if exact:
        return exact[0]
    hits = [r for r in rows if r.window_id.startswith(key)] if len(key) >= 8 else []
    return hits[0] if len(hits) == 1 else None


WINDOW_NAMED = ("a reason is required", "is the window's operator", "is not on the store's reviewer roster")

command = st.one_of(
    st.fixed_dictionaries({
        "do": st.sampled_from(["approve", "approve", "reject", "needs-fix"]),
        "how": st.integers(0, 9), "pick": st.integers(0, 2), "junk": texts,
        "who": st.sampled_from(["operator", "operator", *PEOPLE, "empty", "text"]),
        "spelling": st.integers(0, SPELLINGS - 1),
        "text": texts, "reason": st.sampled_from(["", " ", "overshot the cube", "text"]), "authorize": st.booleans(),
    }),
    st.fixed_dictionaries({"do": st.just("roster"),
                           "names": st.none() | st.lists(st.sampled_from([*PEOPLE, "", " ", "x,y"]) | texts,
                                                         min_size=1, max_size=3)}),
    st.fixed_dictionaries({"do": st.sampled_from(["show", "list"]), "how": st.integers(0, 9),
                           "pick": st.integers(0, 2), "junk": texts,
                           "status": st.sampled_from(["pending", "approved", "rejected", "needs_fix", None]),
                           "operator": st.none() | st.sampled_from(OPERATORS[:2]), "spelling": st.integers(0, 5)}),
)


def _state(path) -> tuple:
    st_ = EpisodeStore.open(path)
    return st_.reviewers, {i.episode_id: st_.label_versions(i.episode_id) for i in st_.episodes()}


def _roster_after(names: list[str] | None, roster):
    """What `store reviewers --set ",".join(names)` (or --clear for None) leaves; "refused" when it must refuse."""
    if names is None:
        return None
    got, seen = [], set()
    for raw in ",".join(names).split(","):
        name = " ".join(raw.split())
        if not name:
            return "refused"
        if _key(name) not in seen:
            seen.add(_key(name))
            got.append(name)
    return got


@budget(25)
@given(commands=st.lists(command, min_size=1, max_size=8))
def test_review_commands_never_lose_a_decision_and_refuse_in_one_line(template, tmp_path_factory, capsys,
                                                                        commands):
    src, rows = template
    path = tmp_path_factory.mktemp("review") / "store"
    shutil.copytree(src, path)
    made: dict[str, list[tuple]] = {r.window_id: [] for r in rows}
    roster = None
    for c in commands:
        before = _state(path)
        if c["do"] == "roster":
            want = _roster_after(c["names"], roster)
            args = ["--clear"] if c["names"] is None else [f"--set={','.join(c['names'])}"]
            r = run_cli(capsys, "store", "reviewers", *args, "--", path)
            if want == "refused":
                assert "reviewer pseudonym" in r.refused()
                assert _state(path) == before
            else:
                assert r.code == 0, r.err
                roster = want
                assert EpisodeStore.open(path).reviewers == roster
            continue
        ref = _ref(rows, c["how"], c["pick"], c["junk"])
        row = _resolve(rows, ref)
        if c["do"] in ("show", "list"):
            if c["do"] == "list":
                args = ["review", "list", "--json", "--quiet"] + ([f"--status={c['status']}"] if c["status"] else [])
                op = c["operator"]
                if op is not None:  # the operator filter takes any spelling of the pseudonym
                    args.append(f"--operator={spell(op, c['spelling'])}")
                r = run_cli(capsys, *args, "--", path)
                assert r.code == 0, r.err
                listed = json.loads(r.out)
                assert all(x["status"] == c["status"] for x in listed) if c["status"] else \
                    len(listed) == sum(op is None or x.operator == op for x in rows)
                assert all(op is None or x["operator"] == op for x in listed)
                text = run_cli(capsys, "review", "list", "--quiet", "--", path)
                assert len(text.out.splitlines()) == len(rows) + 2, text.out  # a header, a line each, a total
            else:
                r = run_cli(capsys, "review", "show", "--json", "--", path, ref)
                if row is None:
                    line = r.refused()
                    assert repr(ref) in line or "window id is needed" in line, line
                else:
                    assert r.code == 0, r.err
                    trail = json.loads(r.out)["trail"]
                    assert [(t["reviewer"], t["status"], t["authorized"], t["reason"]) for t in trail] == \
                        made[row.window_id]
            assert _state(path) == before
            continue

        status = {"approve": "approved", "reject": "rejected", "needs-fix": "needs_fix"}[c["do"]]
        who = c["who"]
        reviewer = {"operator": spell(row.operator, c["spelling"]) if row is not None and row.operator else "op-a",
                    "empty": spell(" ", 0), "text": c["text"]}.get(who) or spell(who, c["spelling"])
        reason = c["text"] if c["reason"] == "text" else c["reason"]
        authorize = c["authorize"] and status == "approved"
        args = ["review", c["do"], f"--reviewer={reviewer}", f"--reason={reason}"]
        if c["do"] == "approve":
            args.append("--authorize" if authorize else "--no-authorize")
        r = run_cli(capsys, *args, "--json", "--", path, ref)

        why = None  # the documented refusals, in the order the command checks them
        if not reviewer.strip():
            why = "a reviewer (pseudonym) is required"
        elif not _visible(reviewer.strip()):
            why = "a pseudonym is one line of visible text"
        elif row is None:
            why = "window"
        elif status != "approved" and not reason.strip():
            why = "a reason is required"
        elif row.operator and _key(reviewer) == _key(row.operator):
            why = "is the window's operator"
        elif authorize and roster is not None and _key(reviewer) not in {_key(x) for x in roster}:
            why = "is not on the store's reviewer roster"
        if why is not None:
            line = r.refused()
            assert why in line, (why, line)
            if why == "window":
                assert repr(ref) in line or "a window id is needed" in line, line
            if row is not None and why in WINDOW_NAMED:
                assert row.window_id in line and row.episode_id in line, line
            assert _state(path) == before  # nothing written
            continue
        assert r.code == 0, r.err
        out = json.loads(r.out)
        assert out["window_id"] == row.window_id and out["status"] == status
        made[row.window_id].append((reviewer.strip(), status, authorize, reason.strip()))

    for w in rows:  # every accepted decision, in order, and nothing else
        trail = [(e.decision.reviewer, e.decision.status.value, e.decision.replay_training_authorized, e.decision.notes)
                 for e in audit_trail(path, w.window_id)]
        assert trail == made[w.window_id], w.window_id


@pytest.mark.parametrize("how", range(SPELLINGS))
def test_the_operator_in_any_spelling_or_lookalike_is_refused_and_authorizes_nothing_by_hand(template, tmp_path,
                                                                                            capsys, how):
    """Fullwidth letters or a zero-width space do not make the operator someone else: `review approve` refuses,
    and the same approval written into the store by hand (an older version, another tool) trains nothing."""
    from hg_dagger.contract import ReviewDecision, ReviewStatus
    from hg_dagger.store.trainable import selection

    src, rows = template
    path = tmp_path / "store"
    shutil.copytree(src, path)
    row = rows[0]
    who = spell(row.operator, how)
    r = run_cli(capsys, "review", "approve", "--authorize", f"--reviewer={who}", "--", path, row.window_id)
    assert ("a pseudonym is one line of visible text" if how == 6 else "is the window's operator") in r.refused()
    st_ = EpisodeStore.open(path, mode="a")
    layer = st_.labels(row.episode_id)
    st_.write_labels(row.episode_id, author="qc:1", qc=[QCResult(episode_id=row.episode_id, passed=True),
                                                       QCResult(episode_id=row.episode_id, window_id=row.window_id,
                                                                passed=True)])
    st_.write_labels(row.episode_id, author="hand", reviews=[*layer.reviews, ReviewDecision(
        window_id=row.window_id, reviewer=who, status=ReviewStatus.APPROVED, replay_training_authorized=True)])
    counts = selection(EpisodeStore.open(path), EpisodeStore.open(path).info(row.episode_id)).counts()
    assert counts["allowed"] == 0 and counts["self_review"] == row.handover_end - row.handover_start
    (listed,) = [x for x in list_windows(path) if x.window_id == row.window_id]
    assert not listed.authorized and "is the window's operator" in listed.problem
