"""Discrete-event simulation of a fleet against the planner core, workloads (generated and
published traces), task/segment records and the metrics tables built from them.
"""
