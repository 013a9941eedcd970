"""Drop-in replacements for older tools: ``from layerscope.compat import torchprof``."""
