"""Domain types: tasks, generations, segments, results, statuses, time-utility functions, the clock.

The bottom layer: imports nothing else from timelyllm_ros.
"""
