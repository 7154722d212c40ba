"""Planner bags without ROS: typestore, writer/reader (rosbags and mcap), damage handling, LRTrace <-> bag, metrics."""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import asdict
from pathlib import Path

import pytest
import yaml

from timelyllm_ros.bags import BagError, BagWriter, bag_info, read_bag
from timelyllm_ros.bags.cli import main as bags_main
from timelyllm_ros.bags.convert import bag_to_workload, load_requests, workload_to_bag
from timelyllm_ros.bags.io import time_msg
from timelyllm_ros.bags.records import bag_metrics, records_from_messages
from timelyllm_ros.bags.typestore import (
    DEFAULT_TOPICS,
    ENGINE_STATE,
    REQUESTS,
    SEGMENT_DONE,
    SEGMENTS,
    msg_class,
    msg_dir,
    typestore,
)
from timelyllm_ros.measure.metrics import summarize
from timelyllm_ros.sim.workloads import generate, load_trace

ROOT = Path(__file__).resolve().parent.parent
WID2 = ROOT / "data" / "lrtrace" / "drone-wid2"
CAT = "Scene: [] Task: [A] Could you find the cat? If so, go to it."


def _tuf(level="normal", alpha=0.0, beta=0.0, ert=0.0):
    return msg_class("timelyllm_ros/msg/TimeUtility")(level=level, alpha=alpha, beta=beta, ert=ert)


def _req(ns, task_id, robot="drone_0", accepted=True, level="normal", task=CAT):
    return msg_class(REQUESTS.msgtype)(stamp=time_msg(ns), sent=time_msg(0), task_id=task_id, robot_id=robot,
                                       robot_type="drone", task=task, tuf=_tuf(level), accepted=accepted,
                                       error="" if accepted else "robot_type: unknown",
                                       status=0 if accepted else 1)  # PlanResult.STATUS_REJECTED: invalid


def _seg(ns, task_id, k, text, final, robot="drone_0"):
    call = msg_class("timelyllm_ros/msg/SkillCall")(name="s", long_name="scan", raw="s('cat')", args=["'cat'"],
                                                    skillset_id="drone_minispec")
    dur = msg_class("builtin_interfaces/msg/Duration")(sec=1, nanosec=5)
    return msg_class(SEGMENTS.msgtype)(task_id=task_id, robot_id=robot, segment_index=k, text=text,
                                       skills=[call] if text.strip("};") else [], is_final=final,
                                       stamp_generated=time_msg(ns), predicted_execution=dur,
                                       next_segment_deadline=time_msg(ns + 10**9), auth_seq=0, auth_tag="")


def _done(start, finish, task_id, k, ok=True, robot="drone_0"):
    return msg_class(SEGMENT_DONE.msgtype)(task_id=task_id, robot_id=robot, segment_index=k, start=time_msg(start),
                                           finish=time_msg(finish), success=ok, error="" if ok else "crashed",
                                           auth_seq=0, auth_tag="")


def _synthetic_run(t0=1_700_000_000 * 10**9):
    """(topic, timestamp, message) of two served tasks, a refused one and a robot failure."""
    ms = 1_000_000
    out = [(REQUESTS.name, t0, _req(t0, "a")),
           (REQUESTS.name, t0 + 5 * ms, _req(t0 + 5 * ms, "b", "drone_1", level="urgent")),
           (REQUESTS.name, t0 + 6 * ms, _req(t0 + 6 * ms, "", "x", accepted=False))]
    t = t0 + 100 * ms
    out += [(SEGMENTS.name, t, _seg(t, "b", 0, "?s('cat')==True{", False, "drone_1")),
            (SEGMENTS.name, t + 40 * ms, _seg(t + 40 * ms, "a", 0, "?s('cat')==True{", False)),
            (SEGMENT_DONE.name, t + 900 * ms, _done(t + 10 * ms, t + 800 * ms, "b", 0, robot="drone_1")),
            (SEGMENTS.name, t + 950 * ms, _seg(t + 950 * ms, "b", 1, "g('cat')};", True, "drone_1")),
            (SEGMENT_DONE.name, t + 960 * ms, _done(t + 50 * ms, t + 900 * ms, "a", 0, ok=False)),
            (SEGMENT_DONE.name, t + 2000 * ms, _done(t + 960 * ms, t + 1900 * ms, "b", 1, robot="drone_1"))]
    return out


def _write(path, msgs, topics=DEFAULT_TOPICS):
    with BagWriter(path, topics) as w:
        for topic, ts, m in msgs:
            w.write(topic, m, ts)
    return path


def _nan_eq(a, b):
    return all((isinstance(x, float) and math.isnan(x) and math.isnan(y)) or x == y
               for x, y in zip(asdict(a).values(), asdict(b).values(), strict=True))


def test_typestore_hashes_match_the_rosidl_build():
    """The RIHS01 hashes in a bag must be the ones rosidl computes, or ros2 bag play refuses/mistypes topics."""
    share = ROOT / "install" / "share" / "timelyllm_ros" / "msg"
    if not share.is_dir():
        pytest.skip("no install/: run scripts/setup.sh")
    ts = typestore()
    for f in sorted(share.glob("*.json")):
        want = next(h["hash_string"] for h in json.loads(f.read_text())["type_hashes"]
                    if h["type_name"] == f"timelyllm_ros/msg/{f.stem}")
        assert ts.hash_rihs01(f"timelyllm_ros/msg/{f.stem}") == want, f.stem
    assert (msg_dir() / "TaskRequest.msg").read_text() == (ROOT / "msg" / "TaskRequest.msg").read_text()


def test_write_then_read_with_rosbags_and_mcap(tmp_path):
    msgs = _synthetic_run()
    bag = _write(tmp_path / "run", msgs)
    got = list(read_bag(bag))
    assert [(m.topic, m.timestamp_ns) for m in got] == [(t, ts) for t, ts, _ in msgs]
    assert [m.msg for m in got] == [m for _, _, m in msgs]  # rosbags dataclasses compare by value
    meta = yaml.safe_load((bag / "metadata.yaml").read_text())["rosbag2_bagfile_information"]
    assert meta["version"] == 9 and meta["storage_identifier"] == "mcap"
    topics = {t["topic_metadata"]["name"]: t for t in meta["topics_with_message_count"]}
    assert set(topics) == {t.name for t in DEFAULT_TOPICS}
    assert topics["/plan_requests"]["message_count"] == 3
    assert topics["/plan_requests"]["topic_metadata"]["type_description_hash"].startswith("RIHS01_")
    assert topics[ENGINE_STATE.name]["topic_metadata"]["offered_qos_profiles"][0]["reliability"] == "best_effort"

    # the same file with the mcap library and the ROS 2 decoder: schemas are embedded
    from mcap.reader import make_reader
    from mcap_ros2.decoder import DecoderFactory

    with open(next(bag.glob("*.mcap")), "rb") as f:
        reader = make_reader(f, decoder_factories=[DecoderFactory()])
        schemas = {s.name: s for s in reader.get_summary().schemas.values()}
        decoded = [(c.topic, m.log_time, d) for s, c, m, d in reader.iter_decoded_messages(log_time_order=True)]
    assert schemas["timelyllm_ros/msg/PlanSegment"].encoding == "ros2msg"
    assert b"MSG: timelyllm_ros/SkillCall" in schemas["timelyllm_ros/msg/PlanSegment"].data
    assert [(t, ts) for t, ts, _ in decoded] == [(t, ts) for t, ts, _ in msgs]
    for (_, _, d), (_, _, m) in zip(decoded, msgs, strict=True):
        assert d.task_id == m.task_id and d.robot_id == m.robot_id
    seg = decoded[3][2]
    assert seg.skills[0].raw == "s('cat')" and seg.stamp_generated.sec == msgs[3][2].stamp_generated.sec

    info = bag_info(bag)
    assert info.message_count == len(msgs) and info.duration_s == pytest.approx(2.1)
    assert info.end_ns - info.start_ns == msgs[-1][1] - msgs[0][1]
    assert "Topic: /plan_requests" in info.to_text()


def test_a_bag_with_another_definition_of_our_types_is_refused_by_name(tmp_path):
    """A bag from another timelyllm_ros version (here: TaskRequest before it carried ``sent``) must not be read
    field by field with today's definition."""
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_types_from_msg, get_typestore

    old_def = "\n".join(line for line in (msg_dir() / "TaskRequest.msg").read_text().splitlines()
                         if not line.startswith("builtin_interfaces/Time sent"))
    old = get_typestore(Stores.ROS2_KILTED)
    old.register(get_types_from_msg((msg_dir() / "TimeUtility.msg").read_text(), "timelyllm_ros/msg/TimeUtility"))
    old.register(get_types_from_msg(old_def, REQUESTS.msgtype))
    req = old.types[REQUESTS.msgtype](stamp=time_msg(5), task_id="a", robot_id="drone_0", robot_type="drone",
                                      task=CAT, tuf=old.types["timelyllm_ros/msg/TimeUtility"]("normal", 0.0, 0.0, 0.0),
                                      accepted=True, error="", status=0)
    path = tmp_path / "old"
    with Writer(path, version=8, storage_plugin=StoragePlugin.MCAP) as w:
        conn = w.add_connection(REQUESTS.name, REQUESTS.msgtype, typestore=old)
        w.write(conn, 5, old.serialize_cdr(req, REQUESTS.msgtype))
    with pytest.raises(BagError, match=r"/plan_requests was recorded with another definition of "
                                       r"timelyllm_ros/msg/TaskRequest .*different timelyllm_ros version"):
        list(read_bag(path))
    with pytest.raises(BagError, match="another definition"):
        load_requests(path)
    assert bag_info(path).message_count == 1  # what it holds can still be listed


def test_truncated_corrupt_and_missing_bags_give_clear_errors(tmp_path):
    bag = _write(tmp_path / "good", _synthetic_run())
    mcap = next(bag.glob("*.mcap"))
    data = mcap.read_bytes()

    def damaged(name, content=None, drop_meta=False):
        d = tmp_path / name
        shutil.copytree(bag, d)
        if content is not None:
            (d / mcap.name).write_bytes(content)
        if drop_meta:
            (d / "metadata.yaml").unlink()
        return d

    with pytest.raises(BagError, match="truncated MCAP file"):
        list(read_bag(damaged("trunc", data[: len(data) // 2])))
    with pytest.raises(BagError, match="truncated MCAP file"):
        bag_info(damaged("empty", b""))
    with pytest.raises(BagError, match="not an MCAP file"):
        list(read_bag(damaged("magic", b"garbage!" + data[8:])))
    with pytest.raises(BagError, match="no metadata.yaml"):
        list(read_bag(damaged("nometa", drop_meta=True)))
    with pytest.raises(BagError, match="no such bag"):
        list(read_bag(tmp_path / "nope"))
    # Flip bytes all over the file: every outcome is a full read or a BagError, never another exception.
    outcomes = set()
    for i, pos in enumerate(range(16, len(data) - 16, max(1, len(data) // 60))):
        bad = bytearray(data)
        bad[pos:pos + 8] = b"\xff\x00\xfe\x01\xfd\x02\xfc\x03"
        d = damaged(f"flip{i}", bytes(bad))
        try:
            n = len(list(read_bag(d)))
            outcomes.add("read" if n == 9 else "partial")
        except BagError as e:
            assert str(d) in str(e)
            outcomes.add("error")
    assert "error" in outcomes
    # the CLI turns them into one line and exit code 2
    assert bags_main(["info", str(tmp_path / "trunc")]) == 2


def test_records_and_metrics_from_a_bag(tmp_path):
    msgs = _synthetic_run()
    bag = _write(tmp_path / "run", msgs)
    recs = {r.job_id: r for r in records_from_messages(m for _, _, m in msgs)}
    a, b, x = recs[0], recs[1], recs[2]
    assert (a.status, b.status, x.status) == ("robot_failed", "done", "invalid")
    assert a.task_type == "find_cat" and a.trace_id == 0 and b.level == "urgent" and b.beta == 2.0
    assert b.response_time == pytest.approx(0.105, abs=1e-6) and b.plan == "?s('cat')==True{g('cat')};"
    assert b.robot_waiting == pytest.approx(0.105 + 0.160, abs=1e-6)
    assert b.utility() == pytest.approx(2.0) and [s.exec_s for s in b.segments] == pytest.approx([0.79, 0.94])
    assert len(a.segments) == 1 and a.segments[0].start - a.arrival == pytest.approx(0.150, abs=1e-6)
    rows = bag_metrics(bag)
    live = summarize(records_from_messages(m for _, _, m in msgs))
    assert len(rows) == len(live) and all(_nan_eq(p, q) for p, q in zip(rows, live, strict=True))
    assert rows[-1].n == 3 and rows[-1].served == 2 and rows[-1].failed == 2  # the overall row comes last
    assert bags_main(["metrics", str(bag), "--csv", str(tmp_path / "m.csv")]) == 0
    assert (tmp_path / "m.csv").read_text().startswith("bag,group,n,")


@pytest.mark.parametrize("source", ["wid2", "generated"])
def test_lrtrace_json_to_bag_and_back(tmp_path, source):
    wl = load_trace(WID2) if source == "wid2" else generate("wid3", seed=3, duration_s=120)
    bag = workload_to_bag(wl, tmp_path / "bag", time_base_ns=1_700_000_000 * 10**9)
    back = bag_to_workload(bag)
    assert back.name == wl.name and back.config == wl.config
    assert [j.to_json() for j in back.jobs] == [j.to_json() for j in sorted(wl.jobs, key=lambda j: (j.trigger_time,
                                                                                                   j.job_id))]
    # and through the CLI: bag -> jobs.json -> load_trace
    assert bags_main(["convert", str(bag), str(tmp_path / "out" / "jobs.json")]) == 0
    again = load_trace(tmp_path / "out" / "jobs.json")
    assert [j.to_json() for j in again.jobs] == [j.to_json() for j in back.jobs] and again.config == wl.config
    reqs = load_requests(bag)
    assert len(reqs) == len(wl.jobs) and reqs[0].offset_s == 0.0
    first = min(j.trigger_time for j in wl.jobs)
    assert [r.offset_s for r in reqs] == pytest.approx([j.trigger_time - first for j in back.jobs], abs=1e-9)
    assert reqs == load_requests(WID2) if source == "wid2" else True
    robot_types = {r.robot_type for r in reqs}
    assert robot_types == ({"drone"} if source == "wid2" else {"arm"})


def test_recorded_bag_without_side_channel_converts_to_lrtrace(tmp_path):
    bag = _write(tmp_path / "run", _synthetic_run())
    wl = bag_to_workload(bag, robot_id_format="drone_{agent_id}")
    assert [j.trigger_time for j in wl.jobs] == pytest.approx([0.0, 0.005, 0.006])
    assert [j.agent_id for j in wl.jobs] == [0, 1, 0]  # 'x' is not drone_<n>: numbered in order of appearance
    assert wl.jobs[1].tuf == [2.0, 0.2, pytest.approx(0.5)] and wl.jobs[1].trace_id == 0
    assert wl.jobs[1].exe_time_detail == [("s(", 0.79), ("s(", 0.94)]
    reqs = load_requests(bag)
    assert [r.offset_s for r in reqs] == pytest.approx([0.0, 0.005, 0.006])
    assert [(r.robot_id, r.level, r.task_id) for r in reqs] == [("drone_0", "normal", "a"), ("drone_1", "urgent", "b"),
                                                               ("x", "normal", "")]
