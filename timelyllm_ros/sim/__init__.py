"""Discrete-event simulation of a fleet against the planner core, and the workloads (generated and published
traces) it runs; what a run is worth is measured by ``timelyllm_ros.measure``.
"""
