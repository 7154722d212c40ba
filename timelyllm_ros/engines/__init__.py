"""Real LLM backends behind :class:`timelyllm_ros.core.engine.Engine`."""
