import json

from timelyllm_ros.domain.plans import TaskKey, plan_templates
from timelyllm_ros.sim.workloads import generate, load_trace, load_workload
from timelyllm_ros.skills.skill_files import load_skill_set


def test_wid2_trace_loads():
    wl = load_workload("wid2")
    assert len(wl.jobs) == 532
    assert wl.config["num_agents"] == 42
    assert {j.trace_id for j in wl.jobs} == set(range(8))
    assert all(j.tuf in ([1, 1, 1.5], [2, 0.2, 0.5]) for j in wl.jobs)


def test_plans_match_trace_skills_in_order():
    wl = load_workload("wid2")
    seen = {}
    for j in wl.jobs:
        seen.setdefault(j.trace_id, [k.rstrip("(") for k, _ in j.exe_time_detail])
    for tid, keys in seen.items():
        tpl = plan_templates()[TaskKey("drone", "typefly", tid)]
        names = [c.name for c in load_skill_set(tpl.robot_type).parse(tpl.plan, complete=True)]
        assert names == keys, tid


def test_generate_is_seeded_and_roundtrips(tmp_path):
    a, b = generate("wid1", seed=3), generate("wid1", seed=3)
    assert [j.to_json() for j in a.jobs] == [j.to_json() for j in b.jobs]
    assert a.jobs and all(0 <= j.agent_id < 25 for j in a.jobs)
    sizes = [len(x) for x in a.config["data_sample_structure"]]
    assert all(4 <= n <= 8 for n in sizes)
    a.save(tmp_path / "w")
    back = load_trace(tmp_path / "w")
    assert [j.to_json() for j in back.jobs] == json.loads((tmp_path / "w" / "jobs.json").read_text())
    arm = generate("wid3", seed=1, duration_s=100)
    assert arm.jobs and {j.task_key for j in arm.jobs} <= {TaskKey("robotarm", "fltrnn", i) for i in range(3)}
    # the arm's records name their robot as LRTrace does, the drone's (as published) do not
    assert all({"robot_type", "robot_system"} <= j.to_json().keys() for j in arm.jobs)
    assert not any("robot_type" in j.to_json() for j in a.jobs)
    arm.save(tmp_path / "arm")
    assert [j.to_json() for j in load_trace(tmp_path / "arm").jobs] == [j.to_json() for j in arm.jobs]
