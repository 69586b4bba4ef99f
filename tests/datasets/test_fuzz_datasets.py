"""`hg-dagger dataset` under random and garbled configs, options and damaged manifests (hypothesis): every
command either works or exits 2 with one `error:` line naming the file, version or option at fault; none ends
in a traceback; no manifest already written changes by a byte, and a refused build writes nothing at all.

Budgets are bounded for CI (derandomized, tests/support/fuzz.py); HG_DAGGER_FUZZ_EXAMPLES=300 runs a longer
random search."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
import support.store as sh
import yaml
from hypothesis import given
from hypothesis import strategies as st
from support.fuzz import budget, run_cli, texts, yaml_values

from hg_dagger.contract import QCResult
from hg_dagger.datasets.build import build
from hg_dagger.datasets.read import check
from hg_dagger.datasets.repository import load, versions
from hg_dagger.review.decisions import decide, list_windows
from hg_dagger.store import EpisodeStore

pytestmark = [pytest.mark.subprocess]


def _approve(path, row) -> None:
    st_ = EpisodeStore.open(path, mode="a")
    st_.write_labels(row.episode_id, author="qc:1", qc=[QCResult(episode_id=row.episode_id, passed=True),
                                                        QCResult(episode_id=row.episode_id, window_id=row.window_id,
                                                                 passed=True)])
    decide(path, row.window_id, "approved", "rev-1", authorize=True)


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """A store of three episodes with a window each and a dataset `ds` of two versions: v1 with the first window
    trainable, v2 with the second too; the third window is never reviewed."""
    base = tmp_path_factory.mktemp("fuzz-datasets")
    store = base / "store"
    with EpisodeStore.create(store).recorder() as rec:
        for seed in range(3):
            sh.record(rec, seed, 12, window=(3, 8), operator="op-a")
    rows = list_windows(store)
    _approve(store, rows[0])
    build("ds", [store], root=base / "datasets")
    _approve(store, rows[1])
    build("ds", [store], root=base / "datasets")
    assert versions(base / "datasets", "ds") == [1, 2]
    return base


def _files(root) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _fresh(template, tmp_path_factory):
    """A copy of the store and its dataset folder (a dataset names its store by absolute path: the store stays)."""
    root = tmp_path_factory.mktemp("ds") / "datasets"
    shutil.copytree(template / "datasets", root)
    return template / "store", root


def _names(line: str, *what) -> bool:
    return any(str(w) in line for w in what)


# ---------------------------------------------------------------------- build configs and options

SECTION_KEYS = {
    "selection": ["task", "rule", "rounds", "recent_rounds", "dedup", "stratify_by", "quota", "retain_rounds", "seed",
                  "unknown"],
    "splits": ["val_fraction", "test_fraction", "isolate", "holdout", "seed", "unknown"],
}
numbers = st.none() | st.integers(-3, 5) | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=4)


@st.composite
def config_files(draw):
    """A dataset config as a person might leave it: right keys with any values, wrong kinds, cut short, bytes."""
    body: dict = {}
    if draw(st.booleans()):
        body["kind"] = draw(st.sampled_from(["dataset", "dataset", "gates", 3, None]))
    for section, keys in SECTION_KEYS.items():
        if draw(st.booleans()):
            picked = draw(st.lists(st.sampled_from(keys), max_size=3, unique=True))
            body[section] = {k: draw(yaml_values | numbers) for k in picked}
    if draw(st.booleans()):
        body[draw(st.sampled_from(["selection", "splits", "other"]))] = draw(yaml_values)
    text = yaml.safe_dump(body, allow_unicode=True)
    how = draw(st.sampled_from(["yaml", "yaml", "truncated", "bytes", "folder", "missing"]))
    if how == "truncated":
        return "text", text[: draw(st.integers(0, len(text)))]
    if how == "bytes":
        return "bytes", draw(st.binary(max_size=48))
    return how, text


options = st.fixed_dictionaries({}, optional={
    "--val-fraction": numbers, "--test-fraction": numbers, "--quota": numbers, "--recent-rounds": numbers,
    "--retain-rounds": numbers, "--version": numbers, "--task": texts,
    "--isolate": st.lists(st.sampled_from(["task", "scene", "operator", "day", "nope"]), min_size=1, max_size=2),
    "--holdout-operators": st.lists(st.sampled_from(["op-a", "op-b"]) | texts, min_size=1, max_size=2),
})


@budget(20)
@given(config=st.none() | config_files(), opts=options, name=st.sampled_from(["ds", "ds", "new", "bad/name", " "]))
def test_build_with_any_config_or_options_writes_a_whole_version_or_nothing(template, tmp_path_factory, capsys,
                                                                              config, opts, name):
    store, root = _fresh(template, tmp_path_factory)
    args = ["dataset", "build", "--quiet", "--json", f"--root={root}", f"--store={store}"]
    cfg = None
    if config is not None:
        how, body = config
        cfg = root.parent / "cfg.yaml"
        if how == "bytes":
            cfg.write_bytes(body)
        elif how == "folder":
            cfg.mkdir()
        elif how != "missing":
            cfg.write_text(body)
        args.append(f"--config={cfg}")
    for flag, value in opts.items():
        args += [flag, *map(str, value)] if isinstance(value, list) else [f"{flag}={value}"]
    before = _files(root)
    r = run_cli(capsys, *args, "--", name)
    after = _files(root)
    assert {k: after.get(k) for k in before} == before  # no manifest changed, none removed
    if r.code == 0:
        out = json.loads(r.out)
        new = set(after) - set(before)
        assert len(new) == out["written"]  # one whole new version, or none
        m = load(root, out["dataset"])  # readable, its hash checks
        assert m.hash == out["hash"]
        assert not check(m)
        return
    line = r.refused()
    assert after == before, line  # a refused build writes nothing
    assert _names(line, cfg, name, "dataset", "--", "key", "argument"), line


# ---------------------------------------------------------------------- damaged manifests


def _rehash(data: dict) -> None:
    body = {k: v for k, v in data.items() if k not in ("hash", "created_wall", "author")}
    data["hash"] = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _paths(data) -> list[list]:
    """Paths to every value of a JSON document (dict keys and list indices)."""
    out = []

    def walk(x, at):
        out.append(at)
        if isinstance(x, dict):
            for k, v in x.items():
                walk(v, [*at, k])
        elif isinstance(x, list):
            for i, v in enumerate(x):
                walk(v, [*at, i])

    walk(data, [])
    return out[1:]


EDITS = {  # a hand edit that keeps the JSON valid and the hash matching, but the manifest inconsistent
    "sample store": lambda d, i: d["samples"][i].__setitem__("store", "s9"),
    "sample episode": lambda d, i: d["samples"][i].__setitem__("episode_id", "0" * 32),
    "runs past the end": lambda d, i: d["samples"][i].__setitem__("runs", [[0, 10**6]]),
    "runs reversed": lambda d, i: d["samples"][i].__setitem__("runs", [[8, 3], [-2, 1]]),
    "steps reversed": lambda d, i: d["samples"][i].__setitem__("steps", [9, 2]),
    "layer missing": lambda d, i: d["samples"][i].__setitem__("label_version", 99),
    "usage": lambda d, i: d["samples"][i].__setitem__("usage", "trainable"),
    "episode dropped": lambda d, i: d.__setitem__("episodes", d["episodes"][1:]),
    "no stores": lambda d, i: d.__setitem__("stores", []),
    "store twice": lambda d, i: d["stores"].append(dict(d["stores"][0])),
    "store moved": lambda d, i: d["stores"][0].__setitem__("url", "/nonexistent/store"),
    "summary": lambda d, i: d.__setitem__("summary", [{}, {"usage": 3}, {"samples": "many"}][i % 3]),
    "parent": lambda d, i: d.__setitem__("parent_version", [5, 0, -1][i % 3]),
    "split": lambda d, i: d["episodes"][i % len(d["episodes"])].__setitem__("split", "weird"),
}


@st.composite
def damage(draw, text: str):
    """A manifest's text damaged: cut, a byte changed, bytes, one value replaced or removed (and then, half the
    time, its hash made to match again, as a careless hand edit would), or edited consistently and re-hashed."""
    how = draw(st.sampled_from(["cut", "byte", "bytes", "value", "value", "remove", "empty", "edit", "edit"]))
    raw = text.encode()
    if how == "edit":
        data = json.loads(text)
        for name in draw(st.lists(st.sampled_from(sorted(EDITS)), min_size=1, max_size=2, unique=True)):
            EDITS[name](data, draw(st.integers(0, len(data["samples"]) - 1)))
        _rehash(data)
        return json.dumps(data, indent=1).encode()
    if how == "cut":
        return raw[: draw(st.integers(0, len(raw) - 1))]
    if how == "byte":
        i = draw(st.integers(0, len(raw) - 1))
        return raw[:i] + bytes([draw(st.integers(0, 255).filter(lambda b: b != raw[i]))]) + raw[i + 1:]
    if how == "bytes":
        return draw(st.binary(max_size=64))
    if how == "empty":
        return b""
    data = json.loads(text)
    at = draw(st.sampled_from(_paths(data)))
    parent = data
    for k in at[:-1]:
        parent = parent[k]
    if how == "remove":
        del parent[at[-1]]
    else:
        parent[at[-1]] = draw(yaml_values | numbers | st.sampled_from(["s9", "../x", "v3", -1, 10**9]))
    if draw(st.booleans()):
        _rehash(data)
    return json.dumps(data, indent=1).encode()


@budget(30)
@given(which=st.sampled_from([1, 2]), data=st.data(),
       command=st.sampled_from(["ls", "ls-name", "show", "show-file", "show-samples", "diff", "check", "check-alone",
                                "build", "export"]))
def test_a_damaged_manifest_is_one_line_and_stays_as_it_is(template, tmp_path_factory, capsys, which, data, command):
    store, root = _fresh(template, tmp_path_factory)
    target = root / "ds" / f"v{which}.json"
    target.write_bytes(data.draw(damage(target.read_text()), label="damaged"))
    before = _files(root)
    where = [f"--root={root}"]
    out = root.parent / "export"
    argv = {
        "ls": ["dataset", "ls", *where], "ls-name": ["dataset", "ls", *where, "ds"],
        "show": ["dataset", "show", *where, f"ds@v{which}"], "show-file": ["dataset", "show", str(target)],
        "show-samples": ["dataset", "show", "--samples", *where, "ds"],
        "diff": ["dataset", "diff", *where, "ds@v1", "ds@v2"], "check": ["dataset", "check", *where, f"ds@v{which}"],
        "check-alone": ["dataset", "check", "--no-stores", *where, f"ds@v{which}"],
        "build": ["dataset", "build", "--quiet", *where, f"--store={store}", "ds"],
        "export": ["dataset", "export", "--quiet", "--format=ods", f"--out={out}", *where, f"ds@v{which}"],
    }[command]
    r = run_cli(capsys, *argv)
    after = _files(root)
    assert {k: after.get(k) for k in before} == before  # the damaged manifest and the other stay as they are
    if r.code == 0:
        if command == "build":  # a damaged v1 under an intact v2 may build v3 on v2
            assert set(after) - set(before) <= {"ds/v3.json"}
        return
    line = r.refused()
    assert after == before
    assert _names(line, target, f"ds@v{which}", "ds@v"), line
    if command == "export":
        assert not out.exists()  # nothing half written


STRUCTURAL = ("sample store", "sample episode", "runs past the end", "runs reversed", "steps reversed",
              "episode dropped", "no stores", "store twice", "summary", "parent")


@pytest.mark.parametrize("edit", STRUCTURAL)
def test_a_rehashed_inconsistent_manifest_is_named_by_every_reader(template, tmp_path_factory, capsys, edit):
    """Found by the property above: such a manifest passed its hash check and then ended `dataset check` in a
    StopIteration or IndexError, `build` on it in a KeyError, `show` and `ls` in a KeyError or AttributeError."""
    store, root = _fresh(template, tmp_path_factory)
    target = root / "ds" / "v2.json"
    data = json.loads(target.read_text())
    EDITS[edit](data, 1)
    _rehash(data)
    target.write_text(json.dumps(data, indent=1))
    before = _files(root)
    for argv in (["show", "ds"], ["ls", "ds"], ["check", "ds"], ["build", "--quiet", f"--store={store}", "ds"]):
        line = run_cli(capsys, "dataset", *argv, f"--root={root}").refused()
        assert f"{target}: inconsistent manifest: " in line, (argv, line)
    assert _files(root) == before


def test_a_store_a_version_names_that_is_gone_is_named_with_the_version(template, tmp_path_factory, capsys):
    """Found by the property above: `dataset export` (and `build` on it) said only `/nonexistent/store: no episode
    store here`, not which dataset version names that store."""
    store, root = _fresh(template, tmp_path_factory)
    target = root / "ds" / "v2.json"
    data = json.loads(target.read_text())
    EDITS["store moved"](data, 0)
    _rehash(data)
    target.write_text(json.dumps(data, indent=1))
    line = run_cli(capsys, "dataset", "export", "--format=ods", f"--out={root.parent / 'x'}", f"--root={root}",
                   "--", "ds").refused()
    assert "ds@v2: store s0: /nonexistent/store: no episode store here" in line
    line = run_cli(capsys, "dataset", "build", "--quiet", f"--root={root}", f"--store={store}", "--", "ds").refused()
    assert "ds@v3: store s0 (named by ds@v2): /nonexistent/store: no episode store here" in line
    assert not (root.parent / "x").exists() and not (root / "ds" / "v3.json").exists()
