"""Engines that run one profiled LLM step: the built-in torch engine and vLLM."""
