"""Smoke test of ``timelyllm-bench diagnose`` (PUD vs EDF ordering/admission, urgent-only bound)."""

import argparse

from bench import diagnose
from timelyllm_ros.sim.workloads import generate


def test_diagnose_on_a_short_workload():
    wl = generate("wid1", seed=1, duration_s=40.0)
    args = argparse.Namespace(seed=0, context_tokens=150, resume_lead=0.05)
    a = diagnose.ordering_vs_admission(wl, args)
    assert a["decisions_with_2plus_candidates"] >= a["order_differs"] >= 0
    assert a["admitted_set_differs"] >= a["admitted_levels_differ"] >= 0
    b = diagnose.urgent_only_bound(wl, args)
    assert set(b) == {"edf-seg", "pud"} and all(-2 < u <= 1 for u in b.values())
    c = diagnose.loss_decomposition(wl, args)
    assert c["urgent_tasks"] > 0
    assert 0 <= c["loss_queued_before_start"] and c["loss_first_event_cold_cache"] <= c["loss_total"] + 1e-9
