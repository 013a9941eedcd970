"""Live capture: the only part of layerscope that imports torch."""
