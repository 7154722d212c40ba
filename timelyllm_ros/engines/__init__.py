"""LLM engines behind :class:`timelyllm_ros.engines.base.Engine`: vLLM, transformers and the
calibrated simulated engine, plus prompt rendering and the one engine factory.
"""
