"""layerscope.cli."""
