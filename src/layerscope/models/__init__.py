"""Small built-in reference models for the demo, the benchmarks and the tests."""

from layerscope.models.gpt import GPTBlock, TinyGPT
from layerscope.models.resnet import ResNet, resnet18

__all__ = ["GPTBlock", "ResNet", "TinyGPT", "resnet18"]
