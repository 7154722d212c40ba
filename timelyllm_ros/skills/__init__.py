"""The skill languages: skill-set schema (from skills/*.yaml), the MiniSpec parser and validator,
stop checkers that cut a stream into executable segments, the constrained-decoding grammar and
the robot execution-time model. Imports only :mod:`timelyllm_ros.domain`.
"""
