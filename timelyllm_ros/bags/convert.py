"""LRTrace JSON <-> bag, and the request list a replay issues (from either).

A workload becomes a bag of TaskRequest messages on /plan_requests, stamped
at ``time_base + trigger time``, one per job: task id ``j<job_id>``, robot id
from ``robot_id_format`` (default ``{robot_type}_{agent_id}``, e.g. drone_3,
arm_0), robot type from the job's task type (robot_type / robot_system /
trace_id, data/plans.yaml), the job's TUF. Each job's JSON record rides along
on /lrtrace/jobs (std_msgs/String, same timestamp) and config.json in the
bag's custom_data, so JSON -> bag -> JSON gives back the same jobs and config.

A recorded bag (no side channel) converts too: trigger times relative to the
first request, agents numbered by robot id, skill times from SegmentDone.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from timelyllm_ros.domain.plans import DEFAULT_TRACE_ROBOT, plan_templates, template_by_text, trace_robot_of
from timelyllm_ros.domain.tuf import LEVELS, TimeUtility
from timelyllm_ros.sim.workloads import Job, Workload, load_trace, record_robot

from .io import BagError, BagWriter, custom_data, read_bag, stamp_ns, time_msg
from .records import resolve_tuf
from .typestore import LRTRACE_JOBS, REQUESTS, SEGMENT_DONE, SEGMENTS, msg_class

# as timelyllm_ros.ros.workload_client names robots (drone_3, arm_0); the simulator uses agent{agent_id}
DEFAULT_ROBOT_ID_FORMAT = "{robot_type}_{agent_id}"
KEY_CONFIG = "timelyllm.lrtrace.config"
KEY_NAME = "timelyllm.lrtrace.name"
KEY_TIME_BASE = "timelyllm.time_base_ns"


@dataclass
class ReplayRequest:
    """One request to issue: when (seconds after the first), from which robot, what."""

    offset_s: float
    robot_id: str
    robot_type: str
    task: str
    level: str
    alpha: float
    beta: float
    ert: float
    task_id: str = ""  # as recorded (or j<job_id>); a replay sends it only when asked to
    meta: dict[str, Any] = field(default_factory=dict)

    def key(self) -> tuple:
        """Identity of the request regardless of time and task id (what a replay must reproduce)."""
        return self.robot_id, self.robot_type, self.task, self.level, self.alpha, self.beta, self.ert


def _record_robot_of(robot_type: str) -> tuple[str | None, str | None]:
    pair = trace_robot_of(robot_type)
    if pair is None or pair == DEFAULT_TRACE_ROBOT:
        return None, None
    return pair


def is_bag(path: str | Path) -> bool:
    p = Path(path)
    return p.suffix == ".mcap" or (p.is_dir() and ((p / "metadata.yaml").is_file() or any(p.glob("*.mcap"))))


def _robot_type(job: Job) -> str:
    """The skill-set robot type that runs the job's task type (a robotarm job runs on an arm)."""
    tpl = plan_templates().get(job.task_key)
    if tpl is None:  # load_trace refuses such jobs; one built in code is refused here, not sent to a drone
        raise ValueError(f"job {job.job_id}: unknown task type {tuple(job.task_key)} "
                         f"(robot_type, robot_system, trace_id)")
    return tpl.robot_type


def job_request(job: Job, robot_id_format: str = DEFAULT_ROBOT_ID_FORMAT) -> ReplayRequest:
    tuf = TimeUtility.from_trace(job.tuf)
    rtype = _robot_type(job)
    return ReplayRequest(offset_s=job.trigger_time,
                         robot_id=robot_id_format.format(agent_id=job.agent_id, robot_type=rtype),
                         robot_type=rtype, task=job.task_input,
                         level=tuf.level if tuf.level in LEVELS else "", alpha=tuf.alpha, beta=tuf.beta, ert=tuf.ert,
                         task_id=f"j{job.job_id}", meta={"job": job.to_json()})


def _ns(seconds: float) -> int:
    return int(round(seconds * 1e9))


def workload_to_bag(workload: Workload, path: str | Path, *, robot_id_format: str = DEFAULT_ROBOT_ID_FORMAT,
                    time_base_ns: int = 0) -> Path:
    """Write ``workload`` as a bag of requests (see the module docstring); returns the bag folder."""
    req_cls, tuf_cls = msg_class(REQUESTS.msgtype), msg_class("timelyllm_ros/msg/TimeUtility")
    string_cls = msg_class(LRTRACE_JOBS.msgtype)
    meta = {KEY_CONFIG: json.dumps(workload.config), KEY_NAME: workload.name, KEY_TIME_BASE: str(time_base_ns)}
    with BagWriter(path, (REQUESTS, LRTRACE_JOBS), custom_data=meta) as w:
        for job in sorted(workload.jobs, key=lambda j: (j.trigger_time, j.job_id)):
            r = job_request(job, robot_id_format)
            ts = time_base_ns + _ns(job.trigger_time)
            w.write(REQUESTS.name, req_cls(
                stamp=time_msg(ts), sent=time_msg(0), task_id=r.task_id, robot_id=r.robot_id,  # sent: none in a trace
                robot_type=r.robot_type, task=r.task,
                tuf=tuf_cls(level=r.level, alpha=r.alpha, beta=r.beta, ert=r.ert), accepted=True, error="",
                status=0), ts)
            w.write(LRTRACE_JOBS.name, string_cls(data=json.dumps(job.to_json())), ts)
    return Path(path)


def _agent_parser(robot_id_format: str):
    pat = re.escape(robot_id_format).replace(re.escape("{agent_id}"), r"(?P<agent>\d+)")
    pat = pat.replace(re.escape("{robot_type}"), r"[A-Za-z]\w*?")
    rx = re.compile(f"^{pat}$")

    def parse(robot_id: str) -> int | None:
        m = rx.match(robot_id)
        return int(m.group("agent")) if m else None

    return parse


def bag_to_workload(path: str | Path, *, robot_id_format: str = DEFAULT_ROBOT_ID_FORMAT) -> Workload:
    """The LRTrace workload of a bag: exact when it was converted from LRTrace, derived when recorded."""
    path = Path(path)
    meta = custom_data(path)
    name = meta.get(KEY_NAME) or path.name
    config = json.loads(meta[KEY_CONFIG]) if KEY_CONFIG in meta else {"source_bag": str(path)}
    side = [json.loads(m.msg.data) for m in read_bag(path, [LRTRACE_JOBS.name])]
    if side:
        return Workload(name, [Job.from_json(d, str(path)) for d in side], config)

    requests, segments, done = [], {}, {}
    for m in read_bag(path, [REQUESTS.name, SEGMENTS.name, SEGMENT_DONE.name]):
        if m.topic == REQUESTS.name:
            requests.append(m.msg)
        elif m.topic == SEGMENTS.name:
            segments.setdefault(m.msg.task_id, {})[m.msg.segment_index] = m.msg
        else:
            done.setdefault(m.msg.task_id, {})[m.msg.segment_index] = m.msg
    if not requests:
        raise BagError(f"{path}: no requests on {REQUESTS.name}: nothing to convert")
    base = int(meta[KEY_TIME_BASE]) if KEY_TIME_BASE in meta else min(stamp_ns(r.stamp) for r in requests)
    parse = _agent_parser(robot_id_format)
    agents: dict[str, int] = {}
    jobs = []
    for i, r in enumerate(sorted(requests, key=lambda r: stamp_ns(r.stamp))):
        agent = parse(r.robot_id)
        if agent is None:
            agent = agents.setdefault(r.robot_id, len(agents))
        level, alpha, beta, ert = resolve_tuf(r.tuf)
        cutoff = ert - beta / alpha if alpha < 0 else math.inf
        detail = []
        for k, seg in sorted(segments.get(r.task_id, {}).items()):
            d = done.get(r.task_id, {}).get(k)
            if d is None or not seg.skills:
                continue
            dur = (stamp_ns(d.finish) - stamp_ns(d.start)) * 1e-9
            detail += [(f"{c.name}(", round(dur / len(seg.skills), 4)) for c in seg.skills]
        # A request of a Table 2 task becomes that task type; any other keeps trace id -1 under its robot's
        # LRTrace robot type (load_trace refuses it: no plan is known for it).
        tpl = template_by_text(r.robot_type, r.task)
        trace_id = tpl.trace_id if tpl else -1
        rtype, rsystem = record_robot(tpl) if tpl else _record_robot_of(r.robot_type)
        jobs.append(Job(job_id=i, trigger_time=(stamp_ns(r.stamp) - base) * 1e-9, agent_id=agent, trace_id=trace_id,
                        task_input=r.task, exe_time_detail=detail, tuf=[beta, ert, cutoff],
                        task_exe_time=round(sum(v for _, v in detail), 4), robot_type=rtype, robot_system=rsystem))
    return Workload(name, jobs, config)


def load_requests(source: str | Path | Workload, *, robot_id_format: str = DEFAULT_ROBOT_ID_FORMAT
                  ) -> list[ReplayRequest]:
    """Requests to replay, in time order, offsets relative to the first: from a bag (every TaskRequest,
    accepted or refused: the same input), an LRTrace folder / jobs file / name, or a Workload."""
    if isinstance(source, Workload):
        reqs = [job_request(j, robot_id_format) for j in source.jobs]
    elif is_bag(source):
        meta = custom_data(source)
        if KEY_CONFIG in meta:  # converted from LRTrace: the exact jobs
            return load_requests(bag_to_workload(source), robot_id_format=robot_id_format)
        reqs = []
        for m in read_bag(source, [REQUESTS.name]):
            r = m.msg
            reqs.append(ReplayRequest(offset_s=stamp_ns(r.stamp) * 1e-9, robot_id=r.robot_id,
                                      robot_type=r.robot_type, task=r.task, level=r.tuf.level, alpha=r.tuf.alpha,
                                      beta=r.tuf.beta, ert=r.tuf.ert, task_id=r.task_id,
                                      meta={"stamp_ns": stamp_ns(r.stamp), "accepted": r.accepted}))
        if not reqs:
            raise BagError(f"{source}: no requests on {REQUESTS.name}: nothing to replay")
    else:
        try:
            wl = load_trace(source)
        except FileNotFoundError as e:
            raise FileNotFoundError(f"{source}: neither a bag nor an LRTrace workload ({e})") from None
        reqs = [job_request(j, robot_id_format) for j in wl.jobs]
    reqs.sort(key=lambda r: r.offset_s)
    if reqs:
        t0 = reqs[0].offset_s
        if "stamp_ns" in reqs[0].meta:  # exact integer arithmetic for recorded stamps
            n0 = reqs[0].meta["stamp_ns"]
            for r in reqs:
                r.offset_s = (r.meta["stamp_ns"] - n0) * 1e-9
        else:
            for r in reqs:
                r.offset_s -= t0
    return reqs


__all__ = ["DEFAULT_ROBOT_ID_FORMAT", "ReplayRequest", "bag_to_workload", "is_bag", "job_request", "load_requests",
           "workload_to_bag"]
