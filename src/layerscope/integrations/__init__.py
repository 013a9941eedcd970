"""Integrations with training frameworks. Each module imports its framework only when used, and
none is a dependency of layerscope: ``layerscope.integrations.transformers``, ``.accelerate``,
``.lightning``."""
