"""bench load-sweep / shed-audit (issue 28): folder workloads, what seeds vary, identical runs, the shed audit."""

import json
import math

from timelyllm_ros.sim.workloads import Workload, load_workload


def _small_trace(tmp_path, n=10):
    wl = load_workload("wid2")
    folder = tmp_path / "some where" / "my-trace"  # an absolute path, with a space: it named the plot before
    Workload("my-trace", wl.jobs[:n], wl.config).save(folder)
    return folder


def _run(argv):
    from bench import cli

    args = cli.build_parser().parse_args(argv)
    assert args.fn(args) == 0


def test_a_folder_workload_names_its_plot_and_table_by_the_workload_not_the_path(tmp_path):
    folder, out = _small_trace(tmp_path), tmp_path / "out"
    _run(["load-sweep", "--workloads", str(folder), "--loads", "1", "--bursts", "", "--seeds", "1",
          "--policies", "pud-shed,pud", "--out", str(out)])
    assert (out / "load_my-trace.png").stat().st_size > 0
    assert [p.name for p in out.glob("load_*.png")] == ["load_my-trace.png"]
    res = json.loads((out / "results.json").read_text())
    assert list(res["sweeps"]) == ["load-my-trace"] and res["sweeps"]["load-my-trace"]["given_as"] == str(folder)
    assert "## my-trace (my-trace, 10 tasks)" in (out / "summary.md").read_text()


def test_workload_label():
    from bench.load_sweep import workload_label

    wl = Workload("drone-wid1", [], {})
    assert workload_label("wid2", wl) == "wid2"  # a name stays the name it was given
    assert workload_label("/data/traces/drone-wid1", wl) == "drone-wid1"
    assert workload_label("traces/x.json", Workload("x", [], {})) == "x"


def test_identical_runs_are_one_run_not_an_interval(tmp_path):
    from bench.load_sweep import _cell, distinct

    assert distinct([{"a": 1.0, "b": math.nan}, {"a": 1.0, "b": math.nan}]) == [{"a": 1.0, "b": math.nan}]
    assert _cell(0.5, math.nan) == "+0.500 (1 run)" and _cell(0.5, 0.01) == "+0.500 ±0.010"
    folder, out = _small_trace(tmp_path), tmp_path / "out"
    _run(["load-sweep", "--workloads", str(folder), "--loads", "1", "--bursts", "", "--seeds", "2",
          "--jitter-ms", "0", "--policies", "pud-shed,pud", "--out", str(out)])
    res = json.loads((out / "results.json").read_text())
    pts = res["sweeps"]["load-my-trace"]["points"]
    assert all(p["seeds"] == 2 and p["runs"] == 1 and math.isnan(p["all_ci"]) for p in pts)  # no interval
    assert next(p for p in pts if p["policy"] == "pud-shed")["diff_pud_runs"] == 1
    md = (out / "summary.md").read_text()
    assert "(1 run)" in md and "±0.000" not in md and "Seeds (2) vary:" in md


def test_seeds_move_each_copy_of_the_fleet_on_its_own():
    from bench.load_sweep import jitter, scale_fleet

    wl = Workload("t", load_workload("wid2").jobs[:40], {})
    big = scale_fleet(wl, 2.0)
    stride = big.config["fleet_stride"]
    a, b = jitter(big, 0.02, 1), jitter(big, 0.02, 2)
    assert [j.trigger_time for j in a.jobs] != [j.trigger_time for j in b.jobs]  # seeds differ
    first = min(j.trigger_time for j in big.jobs)
    orig = {j.job_id: j.trigger_time for j in big.jobs}
    shift = {}  # copy -> shifts of the first event's tasks
    for j in a.jobs:
        if orig[j.job_id] - first < 0.01:
            shift.setdefault(j.agent_id // stride, set()).add(round(j.trigger_time - orig[j.job_id], 12))
    assert sorted(shift) == [0, 1] and all(len(v) == 1 for v in shift.values())  # an event moves as one...
    assert shift[0] != shift[1]  # ...and each copy of the fleet on its own
    assert all(0.0 <= x <= 0.02 for v in shift.values() for x in v)


def test_shed_audit_lists_each_shed_task_with_what_pud_made_of_it(tmp_path):
    out = tmp_path / "audit"
    _run(["shed-audit", "--workloads", "drone-wid1", "--loads", "3", "--max-jobs", "40", "--jitter-ms", "0",
          "--out", str(out)])
    res = json.loads((out / "shed_audit.json").read_text())
    (pt,) = res["points"]
    assert pt["workload"] == "drone-wid1" and pt["tasks"] == 120 and pt["shed"] == len(pt["rows"])
    assert pt["earn"] == sum(r["earns"] for r in pt["rows"])
    for r in pt["rows"]:
        assert r["shed"] in ("queued", "running") and r["best_case_s"] > max(r["cutoff_s"], r["waited_s"])
        assert r["earns"] == (r["pud_status"] == "done" and (r["pud_u_beta"] or 0) > 0)
    assert (out / "shed_audit.md").read_text().startswith("# Shed audit")
    assert len((out / "shed_audit.csv").read_text().splitlines()) == 1 + pt["shed"]



def test_a_policy_runs_under_the_admission_its_name_gives(monkeypatch):
    import argparse

    import bench.load_sweep as ls

    seen, real = [], ls.run_policy

    def spy(wl, policy, admission, args):
        res = real(wl, policy, admission, args)
        seen.append((res.policy, res.admission))
        return res

    monkeypatch.setattr(ls, "run_policy", spy)
    wl0 = load_workload("wid2")
    wl = Workload("w", wl0.jobs[:6], wl0.config)
    args = argparse.Namespace(seed=0, context_tokens=64, resume_lead=0.1)
    ls.run_point(wl, "pud-shed@adaptive", args)
    ls.run_point(wl, "pud-shed", args)
    assert seen == [("pud-shed", "adaptive"), ("pud-shed", "adaptive-tuf")]  # its own ('auto'): weighing


def test_an_unknown_policy_or_admission_is_refused_by_name_before_any_run(tmp_path):
    import pytest

    from bench import cli

    for spec, word in (("pud-shed@adaptve-tuf", "unknown admission 'adaptve-tuf'"), ("pdu", "unknown policy 'pdu'")):
        args = cli.build_parser().parse_args(["load-sweep", "--workloads", "wid2", "--bursts", "", "--policies", spec,
                                              "--out", str(tmp_path)])
        with pytest.raises(SystemExit, match=word):
            args.fn(args)
    assert not (tmp_path / "summary.md").exists()
