"""The exporter registry without a store: the built-in records, what a record may declare, and the dispatch both
commands use - a format's options get their defaults, an option of another format or a value outside its choices
is one line naming it, and the summary says what of the output is training data."""

from __future__ import annotations

import pytest

from hg_dagger.datasets import EXPORTERS, Exporter, ExportError, ExportOption, ExportSummary, Training, export
from hg_dagger.datasets.exporters import exporter, option_table, resolve_options
from hg_dagger.registry import RegistryError


def test_the_built_in_formats_and_what_they_offer_as_training_data():
    assert {"lerobot", "ods", "rlinf"} <= set(EXPORTERS.names())
    assert {EXPORTERS.origin(n) for n in ("lerobot", "ods", "rlinf")} == {"hg_dagger"}
    lerobot = exporter("lerobot")
    assert lerobot.training_for(resolve_options("lerobot", {"labels": "trainable"})) == Training.LABELS
    assert lerobot.training_for(resolve_options("lerobot", {})) == Training.MASK  # --labels all, the default
    assert exporter("ods").training_for({}) == Training.MASK and exporter("rlinf").training_for({}) == Training.LABELS
    table = option_table()
    assert [f for f, _ in table["labels"]] == ["lerobot"] and [f for f, _ in table["layout"]] == ["ods"]
    assert resolve_options("lerobot", {"labels": None, "video": "av1", "layout": None}) == {"labels": "all",
                                                                                            "video": "av1"}
    assert resolve_options("ods", {}) == {"layout": "padded"} and resolve_options("rlinf", {}) == {}


@pytest.mark.parametrize("fmt, given, message", [
    ("ods", {"video": "h264"}, "--video is for --format lerobot"),
    ("rlinf", {"labels": "all"}, "--labels is for --format lerobot"),  # given, even as lerobot's default
    ("lerobot", {"layout": "ragged"}, "--layout is for --format ods"),
    ("lerobot", {"labels": "some"}, "--format lerobot: --labels must be one of all, trainable, not 'some'"),
    ("lerobot", {"colour": "red"}, "export format 'lerobot' has no option --colour"),
    ("csv", {}, "unknown export format 'csv' (known: "),
])
def test_a_bad_format_or_option_is_one_line_naming_it(fmt, given, message):
    with pytest.raises((ExportError, RegistryError)) as err:
        resolve_options(fmt, given)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_record_is_checked_when_it_is_made():
    with pytest.raises(RegistryError, match="export option name 'out'"):
        ExportOption("out", "where")  # the commands' own argument
    with pytest.raises(RegistryError, match="export option name 'Delim'"):
        ExportOption("Delim", "x")
    with pytest.raises(RegistryError, match="default 'x' is not one of its choices"):
        ExportOption("delimiter", "d", choices=("comma", "tab"), default="x")
    with pytest.raises(RegistryError, match="named twice"):
        Exporter(write=print, description="d", options=(ExportOption("a", "a"), ExportOption("a", "b")))
    with pytest.raises(ValueError):
        Exporter(write=print, description="d", training="sometimes")
    assert Exporter(write=print, description="d").training_for({}) == Training.NONE  # says nothing: not training data
    assert ExportOption("frame_rate", "f").flag == "--frame-rate"


def test_dispatch_fills_defaults_and_the_summary_says_what_is_training_data(tmp_path):
    calls = []

    def write(items, out, *, progress=False, shade="light"):
        calls.append((list(items), out, progress, shade))
        return ExportSummary(out=str(out), format="probe", episodes=0, frames=3)

    EXPORTERS.register("probe-test", Exporter(write=write, description="a probe", options=(
        ExportOption("shade", "light or dark", choices=("light", "dark"), default="light"),)), origin="tests",
        replace=True)
    summary = export("probe-test", [], tmp_path / "a", progress=True)
    assert calls[-1] == ([], tmp_path / "a", True, "light")
    assert summary.training == "none" and summary.line().endswith("; " + Training.NONE.note)
    export("probe-test", [], tmp_path / "b", shade="dark")
    assert calls[-1][3] == "dark"
    with pytest.raises(ExportError, match="--shade is for --format probe-test"):
        export("ods", [], tmp_path / "c", shade="dark")
    # a "module:function" writer is imported when the format is used
    lazy = Exporter(write="hg_dagger.datasets.export_rlinf:export_rlinf", description="lazy")
    from hg_dagger.datasets import export_rlinf

    assert lazy.writer() is export_rlinf
