"""Time to the first segment on the default install, each task alone after the planner's warm-up.

    python bench/first_segment.py LABEL [--tasks FILE ...] [--decoding default|constrained|unconstrained] [--judge]

The planner's own path: ``planner_engine("engine_vllm_cpu.yaml")`` (its dtype, speculation and constrained
decoding), PromptRenderer's warm-up prompts (with their grammar where the renderer gives one), then every
task of data/plans.yaml and of each ``--tasks`` file rendered and generated alone, timed from adding the
request to its first segment. Prints one JSON line (median, mean, max and per task, in ms, with the tokens
of each first segment). It uses only APIs that older checkouts have too, so the same file measures a
before and an after side by side: run it with PYTHONPATH and TIMELYLLM_SHARE of the other checkout
(bench/results/plan_quality/README.md has the commands and numbers).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from timelyllm_ros.domain.plans import plan_templates
from timelyllm_ros.engines import driver
from timelyllm_ros.engines.base import EngineRequest
from timelyllm_ros.engines.factory import planner_engine
from timelyllm_ros.engines.prompts import PromptRenderer
from timelyllm_ros.skills import quality
from timelyllm_ros.skills.segmenter import make_stop_checker


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("label")
    ap.add_argument("--tasks", action="append", default=[], help="more tasks in the data/plans.yaml format")
    ap.add_argument("--decoding", choices=("default", "constrained", "unconstrained"), default="default")
    ap.add_argument("--engine", default="engine_vllm_cpu.yaml")
    ap.add_argument("--judge", action="store_true",
                    help="also write each plan to its end on the same path and judge it (skills/quality.py)")
    args = ap.parse_args()
    engine, constrained = planner_engine(args.engine)
    if args.decoding != "default":
        constrained = args.decoding == "constrained"
    tasks = list(plan_templates().values())
    for f in args.tasks:
        tasks += list(plan_templates(f).values())
    r = PromptRenderer(engine, constrained=constrained)
    singles, burst = r.warm_up_prompts(["drone", "arm"])
    extra = getattr(r, "warm_up_extra", lambda rt: {})  # a checkout before it warmed no grammar
    for i, (rt, ids) in enumerate(singles):
        driver.run(engine, [EngineRequest(f"warm/{i}", list(ids), make_stop_checker(r.builder(rt).skillset),
                                          max_new_tokens=1, extra=dict(extra(rt)))])
    driver.run(engine, [EngineRequest(f"burst/{i}", list(ids), make_stop_checker(r.builder(rt).skillset),
                                      max_new_tokens=4) for i, (rt, ids) in enumerate(burst)])
    ms: dict[str, float] = {}
    tokens: dict[str, int] = {}
    judged: dict[str, dict] = {}
    for t in tasks:
        ids, ex = r.render(t.robot_type, t.task_input)
        req = EngineRequest(f"t/{t.name}", ids, make_stop_checker(r.builder(t.robot_type).skillset),
                            max_new_tokens=128, extra=ex)
        t0 = time.perf_counter()
        engine.add(req)
        last = None
        while t.name not in ms and engine.has_work():
            for ev in engine.step().events:
                if ev.gen_id == req.gen_id and t.name not in ms:
                    ms[t.name] = (time.perf_counter() - t0) * 1000
                    tokens[t.name] = len(ev.token_ids)
                    last = ev
        if args.judge:  # the rest of the plan after the timing: each segment resumed at once, as on an idle planner
            while last is not None and not last.final:
                if last.suspended:
                    engine.add(req)
                last = None
                while last is None and engine.has_work():
                    last = next((ev for ev in engine.step().events if ev.gen_id == req.gen_id), None)
            plan = engine.decode(req.output_token_ids)
            v = quality.judge(plan, r.builder(t.robot_type).skillset, quality.template_spec(t))
            judged[t.name] = {"plan": plan, "acceptable": v.acceptable}
        engine.abort(req.gen_id)
    v = list(ms.values())
    print(json.dumps({"label": args.label, "constrained": constrained, "warm_prompts": len(singles),
                      "median_ms": statistics.median(v), "mean_ms": statistics.mean(v), "max_ms": max(v),
                      "per_task": ms, "tokens": tokens}
                     | ({"judged": judged, "acceptable": sum(j["acceptable"] for j in judged.values())}
                        if args.judge else {})))
    engine.close()


if __name__ == "__main__":
    main()
