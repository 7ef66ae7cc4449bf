"""memrl: train LLM agents that remember."""

__version__ = "0.1.0"
