"""Exports: Chrome trace with backward module tracks, collapsed stacks, CSV, the report command."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import orjson
import pytest
import torch

import layerscope as ls
from layerscope.cli import main
from layerscope.errors import UsageError
from layerscope.render.chrome import BACKWARD_TRACK
from layerscope.render.exports import collapsed_stacks, modules_csv, ops_csv
from tests.fixtures.models import TinyMLP


@pytest.fixture(scope="module")
def session() -> ls.profile:
    model = TinyMLP()
    with ls.profile(model, memory=True) as prof:
        model(torch.randn(4, 8)).sum().backward()
    return prof


def test_chrome_trace_has_backward_tracks_and_exports_twice(session: ls.profile, tmp_path: Path) -> None:
    first = session.export_chrome_trace(tmp_path / "a.json")
    second = session.export_chrome_trace(tmp_path / "b.json.gz")  # torch's own refuses a second export
    events = orjson.loads(first.read_bytes())["traceEvents"]
    backward = [e for e in events if e.get("tid") == BACKWARD_TRACK and e["ph"] == "X"]
    names = [e["name"] for e in backward]
    assert {"fc1", "fc2", "act"} <= set(names)
    assert names.index("fc2") < names.index("fc1")  # backward runs from the last layer to the first
    assert any(e["ph"] == "M" and e.get("tid") == BACKWARD_TRACK for e in events)
    forward = [e for e in events if str(e.get("name", "")).startswith("ls:fc1:")]
    assert forward  # forward module ranges are there too
    assert ls.load(second).find("fc1").calls == 1


def test_report_chrome_adds_backward_track_to_a_plain_trace(session: ls.profile, tmp_path: Path) -> None:
    import gzip

    exported = orjson.loads(session.export_chrome_trace(tmp_path / "a.json").read_bytes())
    ours = [e for e in exported["traceEvents"] if e.get("tid") == BACKWARD_TRACK]
    kept = [e for e in exported["traceEvents"] if e.get("tid") != BACKWARD_TRACK]
    plain = {**exported, "traceEvents": kept}
    (tmp_path / "plain.json").write_bytes(orjson.dumps(plain))
    out = tmp_path / "out.json.gz"
    assert main(["report", str(tmp_path / "plain.json"), "--format", "chrome", "-o", str(out)]) == 0
    again = orjson.loads(gzip.decompress(out.read_bytes()))["traceEvents"]
    assert [e for e in again if e.get("tid") == BACKWARD_TRACK] == ours
    saved = session.profile.save(tmp_path / "run.json")
    assert main(["report", str(saved), "--format", "chrome", "-o", str(tmp_path / "x.json")]) == 2
    assert not (tmp_path / "x.json").exists()
    (tmp_path / "garbage.json").write_bytes(b"\x1f\x8bnot gzip")
    assert (
        main(["report", str(tmp_path / "garbage.json"), "--format", "chrome", "-o", str(tmp_path / "y.json")])
        == 2
    )
    assert not (tmp_path / "y.json").exists()


def test_collapsed_stacks_account_for_all_cpu_time(session: ls.profile) -> None:
    p = session.profile
    text = collapsed_stacks(p, "cpu_us")
    lines = text.splitlines()
    assert any(line.startswith("TinyMLP;fc1;aten::linear ") for line in lines)
    assert any(line.startswith("[backward];TinyMLP;fc2;") for line in lines)
    assert any(line.startswith("[unattributed];") for line in lines)
    total = sum(int(line.rsplit(" ", 1)[1]) for line in lines)
    assert abs(total - p.totals.cpu_us) <= len(lines)  # each line rounds by at most 0.5 µs (+ dropped zeros)
    flops = collapsed_stacks(p, "flops")
    assert sum(int(line.rsplit(" ", 1)[1]) for line in flops.splitlines()) == p.totals.flops
    with pytest.raises(UsageError):
        collapsed_stacks(p, "speed")


def test_csv_rows(session: ls.profile) -> None:
    p = session.profile
    modules = list(csv.DictReader(io.StringIO(modules_csv(p))))
    assert len(modules) == 2 * len(list(p.modules()))
    fc1 = next(r for r in modules if r["path"] == "fc1" and r["phase"] == "forward")
    assert float(fc1["cpu_us"]) == p.find("fc1").forward.cpu_us and fc1["type"] == "Linear"
    ops = list(csv.DictReader(io.StringIO(ops_csv(p))))
    assert len(ops) == len(p.op_rows) and sum(int(r["calls"]) for r in ops) == sum(r.calls for r in p.op_rows)


def test_report_command(session: ls.profile, tmp_path: Path) -> None:
    saved = session.profile.save(tmp_path / "run.json")
    assert main(["report", str(saved), "-o", str(tmp_path / "r.csv")]) == 0
    assert (tmp_path / "r.modules.csv").exists() and (tmp_path / "r.ops.csv").exists()
    assert main(["report", str(saved), "-o", str(tmp_path / "r.folded"), "--metric", "cpu_alloc_bytes"]) == 0
    assert (tmp_path / "r.folded").read_text().strip()
    assert main(["report", str(saved), "-o", str(tmp_path / "copy.json.gz")]) == 0
    assert ls.load(tmp_path / "copy.json.gz") == session.profile
    assert main(["report", str(saved), "-o", str(tmp_path / "r.xyz")]) == 2


def test_svg_flamegraph_structure_and_escaping(session: ls.profile, tmp_path: Path) -> None:
    import shutil
    import subprocess
    import xml.dom.minidom

    from layerscope.attribution import build_profile, module_range_name
    from layerscope.events import EventKind, EventTable
    from layerscope.render.flamegraph import flamegraph_svg

    svg = flamegraph_svg(session.profile)
    doc = xml.dom.minidom.parseString(svg.encode())
    frames = [g for g in doc.getElementsByTagName("g") if g.getAttribute("class") == "f"]
    names = {g.getElementsByTagName("title")[0].firstChild.data.split(" — ")[0] for g in frames}
    assert {"all", "TinyMLP", "fc1", "[backward]"} <= names
    root = next(g for g in frames if g.getAttribute("data-d") == "0")
    assert float(root.getAttribute("data-w")) == 1.0
    # a hostile module name is text, not markup
    t = EventTable()
    t.add_span(module_range_name("", "Net"), EventKind.CPU_OP, 1, 0, 100_000)
    t.add_span(
        module_range_name("<img src=x onerror=alert(1)>", "Linear"), EventKind.CPU_OP, 1, 10_000, 50_000
    )
    hostile = flamegraph_svg(build_profile(t, None))
    assert "<img" not in hostile and "&lt;img src=x onerror=alert(1)&gt;" in hostile
    xml.dom.minidom.parseString(hostile.encode())
    if shutil.which("node"):  # the inlined script at least parses
        script = tmp_path / "flame.js"
        script.write_text(svg.split("<![CDATA[", 1)[1].split("]]>", 1)[0])
        assert subprocess.run(["node", "--check", str(script)], check=False).returncode == 0


def test_flamegraph_with_thousands_of_frames_culls_sub_pixel_ones() -> None:
    import xml.dom.minidom

    from layerscope.attribution import build_profile, module_range_name
    from layerscope.events import EventKind, EventTable
    from layerscope.render.flamegraph import WIDTH, flamegraph_svg

    # 1,000 modules of 1 µs each and one of 1 ms in 2.05 ms: the small ones are ~0.59 px wide
    t = EventTable()
    t.add_span(module_range_name("", "Net"), EventKind.CPU_OP, 1, 0, 2_050_000)
    for k in range(1000):
        t.add_span(module_range_name(f"blocks.{k}", "Linear"), EventKind.CPU_OP, 1, 10_000 + k * 1_000, 1_000)
    t.add_span(module_range_name("big", "Linear"), EventKind.CPU_OP, 1, 1_020_000, 1_000_000)
    t.add_span(module_range_name("tiny", "Linear"), EventKind.CPU_OP, 1, 2_030_000, 100)  # 0.06 px
    profile = build_profile(t, None)
    profile.validate()
    doc = xml.dom.minidom.parseString(flamegraph_svg(profile).encode())
    frames = [g for g in doc.getElementsByTagName("g") if g.getAttribute("class") == "f"]
    widths = [float(g.getAttribute("data-w")) * WIDTH for g in frames]
    assert all(w >= 0.5 for w in widths)
    names = {g.getElementsByTagName("title")[0].firstChild.data.split(" — ")[0] for g in frames}
    assert "big" in names and len(frames) > 1000  # every frame of at least half a pixel is drawn
    assert "tiny" not in names
    assert int(doc.documentElement.getAttribute("height")) < 300  # no empty rows for culled depths
