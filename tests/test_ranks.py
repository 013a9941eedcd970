"""Multi-rank: a real two-process gloo DDP job, merged; and merges of hand-built profiles."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

import layerscope as ls
from layerscope.analysis.ranks import COMMUNICATION
from layerscope.analysis.ranks import merge_profiles as merge
from layerscope.attribution import build_profile, module_range_name
from layerscope.cli import main
from layerscope.errors import UsageError
from layerscope.events import EventKind, EventTable
from layerscope.model.meta import DistributedInfo

JOB = Path(__file__).parent / "fixtures" / "ddp_job.py"


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("ddp")
    done = subprocess.run(
        [sys.executable, str(JOB), str(folder)], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return folder


def test_ddp_job_merge_names_the_slow_rank_and_module(ddp_run: Path) -> None:
    files = sorted(ddp_run.glob("rank*.json.gz"))
    assert [f.name[:5] for f in files] == ["rank0", "rank1"]
    profiles = [ls.load(f) for f in files]
    for k, p in enumerate(profiles):
        p.validate()
        assert p.meta.distributed == DistributedInfo(rank=k, world_size=2, backend="gloo")
        assert any(COMMUNICATION.search(r.name) and "all_reduce" in r.name for r in p.op_rows)
    merged = ls.merge(profiles)
    s = merged.straggler
    assert s is not None and s.is_straggler
    assert s.rank == 1 and s.module == "module.slow" and s.phase == "forward"
    assert s.module_excess_us > 25_000  # the 30 ms sleep
    assert s.others_wait_us > 20_000  # rank 0 waits in all_reduce for it
    rank0, rank1 = merged.summaries
    assert rank0.communication_us > rank1.communication_us


def test_merge_cli(ddp_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "merged.json"
    assert main(["merge", str(ddp_run), "-o", str(out), "--ascii"]) == 0
    printed = capsys.readouterr().out
    assert "Straggler: rank 1" in printed and "module.slow" in printed
    data = orjson.loads(out.read_bytes())
    assert data["straggler"]["rank"] == 1 and data["ranks"] == [0, 1]


def one(paths: list[str], self_us: dict[str, int]) -> ls.Profile:
    """A hand-built rank profile: modules laid out one after another, each with the given self time."""
    t = EventTable()
    total = sum(self_us.values()) + 10
    t.add_span(module_range_name("", "Net"), EventKind.CPU_OP, 1, 0, total * 1000)
    cursor = 5
    for path in paths:
        t.add_span(
            module_range_name(path, "Linear"), EventKind.CPU_OP, 1, cursor * 1000, self_us[path] * 1000
        )
        cursor += self_us[path]
    return build_profile(t, None)


def test_different_module_trees_merge_as_a_union_with_gaps() -> None:
    a = one(["enc", "head"], {"enc": 100, "head": 50})
    b = one(["enc", "extra"], {"enc": 100, "extra": 500})
    merged = merge([a, b])
    assert set(merged.gaps) == {"head", "extra"}
    extra = next(m for m in merged.modules if m.path == "extra" and m.phase == "forward")
    assert extra.values == (None, 500.0)
    assert merged.straggler is not None and merged.straggler.rank == 1
    assert merged.straggler.module == "extra"


def test_merge_needs_two_ranks() -> None:
    with pytest.raises(UsageError, match="at least two"):
        merge([one(["enc"], {"enc": 1})])


def test_merge_real_two_rank_traces(real_traces: Path) -> None:
    merged = merge([ls.load(real_traces / "two_ranks" / f"rank-{k}.json.gz") for k in (0, 1)])
    assert merged.ranks == (0, 1) and merged.metric == "device_us"
    assert all(s.communication_us > 0 for s in merged.summaries)


def test_collectives_with_message_sizes_and_groups(real_traces: Path) -> None:
    import gzip

    path = real_traces / "cuda_nccl_distributed.json.gz"
    events = orjson.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    expected = sum(
        max(e["args"]["In msg nelems"], e["args"]["Out msg nelems"]) * 4
        for e in events
        if e.get("name") == "record_param_comms" and e["args"].get("Collective name") == "allreduce"
    )
    comm = ls.load(path).meta.trace.communication
    allreduce = next(c for c in comm if c["collective"] == "allreduce")
    assert (
        allreduce["bytes"] == expected and allreduce["group"] == "default_pg" and allreduce["group_size"] == 2
    )
    assert allreduce["calls"] == 15 and allreduce["cpu_us"] > 0


def test_ranks_html_heatmap_marks_the_straggler_and_escapes_names(tmp_path: Path) -> None:
    import xml.dom.minidom

    from layerscope.render.ranks_html import heatmap_rows, ranks_html

    hostile = "<img src=x onerror=alert(1)>"
    fast = {"enc": 100, hostile: 50}
    profiles = [
        one(["enc", hostile], fast),
        one(["enc", hostile], {"enc": 300, hostile: 50}),
        one(["enc", hostile], fast),
    ]
    merged = merge(profiles)
    page = ranks_html(merged, top=5)
    assert hostile not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    heatmap = page[
        page.index('<table id="heatmap">') : page.index("</table>", page.index('<table id="heatmap">'))
    ]
    doc = xml.dom.minidom.parseString((heatmap + "</table>").encode())
    rows = doc.getElementsByTagName("tbody")[0].getElementsByTagName("tr")
    assert len(rows) == len(heatmap_rows(merged, 5))
    assert all(len(r.getElementsByTagName("td")) == 2 + len(merged.ranks) for r in rows)
    first = rows[0].getElementsByTagName("td")
    assert first[0].firstChild.data == "enc"  # the largest spread comes first
    marked = [td for td in doc.getElementsByTagName("td") if "straggler" in td.getAttribute("class")]
    assert len(marked) == 1 and marked[0] is first[2 + merged.ranks.index(1)]
    assert marked[0].getAttribute("style").startswith("background:rgb(255,")  # slower than the median: red


def test_merge_cli_writes_the_html_page(ddp_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "ranks.html"
    assert main(["merge", str(ddp_run), "-o", str(out), "--ascii"]) == 0
    page = out.read_text(encoding="utf-8")
    assert "Straggler: rank 1" in page and "module.slow" in page
    assert page.count('<td class="l">rank ') == 2
