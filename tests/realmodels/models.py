"""The zoo's models: Hugging Face transformers families with tiny random configs, built from their
Config classes (no network, no hub, no weights), and the inputs of one training step each.

Every case is a training step as users write it: ``loss = model(**inputs).loss; loss.backward()``,
the model in ``train()`` mode (dropout on: the profiled and unprofiled runs start from the same RNG
state, so RNG use shows). Batch 2 x 8 tokens (or a 2 x 3 x 32 x 32 image, 2 x 16 x 32 mel frames,
2 x 400 audio samples): the zoo checks what profiling does to real code paths, not speed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import transformers as tf
from torch import nn
from transformers.utils.deprecation import deprecate_kwarg

BATCH, SEQ, VOCAB = 2, 8, 128
LAYERS = 2
# The shape every decoder and encoder family shares (Llama's names; the others map them).
TEXT: dict[str, Any] = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": 4,
    "vocab_size": VOCAB,
}
SEQ2SEQ: dict[str, Any] = {
    "d_model": 32,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "encoder_layers": LAYERS,
    "decoder_layers": LAYERS,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "vocab_size": VOCAB,
    "max_position_embeddings": 64,
}


@dataclass(frozen=True)
class Case:
    """One zoo entry: how to build the model and its inputs, and how it is run."""

    id: str
    kind: str  # decoder, encoder, encoder-decoder, moe, vision, speech, state-space
    build: Callable[[], nn.Module]
    inputs: Callable[[torch.Generator], dict[str, torch.Tensor]]
    #: gradient checkpointing's use_reentrant (None: checkpointing off)
    reentrant: bool | None = None
    #: compiled with torch.compile (whole model, one compile)
    compiled: bool = False
    #: the class name of the module inside each checkpointed layer whose forward calls are counted
    counted: str | None = None

    @property
    def checkpointed(self) -> bool:
        """Whether gradient checkpointing is on."""
        return self.reentrant is not None


def _tokens(gen: torch.Generator) -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)


def causal_lm(gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Next-token prediction: the labels are the inputs (the model shifts them)."""
    ids = _tokens(gen)
    return {"input_ids": ids, "labels": ids}


def seq2seq(gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Source tokens in, target tokens as labels (the model makes the decoder inputs from them)."""
    return {"input_ids": _tokens(gen), "labels": _tokens(gen)}


#: set, not left to transformers: its classification loss sets ``config.problem_type`` on the first
#: call, a change to the model that makes a compiled model recompile on the second, profiled or not
CLASSIFY: dict[str, Any] = {"num_labels": 10, "problem_type": "single_label_classification"}


def image(gen: torch.Generator) -> dict[str, torch.Tensor]:
    """A 32 x 32 RGB batch with class labels."""
    return {
        "pixel_values": torch.randn(BATCH, 3, 32, 32, generator=gen),
        "labels": torch.randint(0, 10, (BATCH,), generator=gen),
    }


def mel(gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Whisper: 16 mel bins x 32 frames (the encoder's two convs halve them to its 16 positions)."""
    return {"input_features": torch.randn(BATCH, 16, 32, generator=gen), "labels": _tokens(gen)}


def waveform(gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Wav2Vec2 with CTC: 400 samples (two stride-4 convs: 23 frames) and 4 target tokens each."""
    return {
        "input_values": torch.randn(BATCH, 400, generator=gen),
        "labels": torch.randint(1, VOCAB, (BATCH, 4), generator=gen),
    }


def _llama() -> nn.Module:
    return tf.LlamaForCausalLM(tf.LlamaConfig(**TEXT, num_key_value_heads=2))


def _gpt2() -> nn.Module:
    config = tf.GPT2Config(
        n_embd=32, n_layer=LAYERS, n_head=4, vocab_size=VOCAB, n_positions=64, bos_token_id=0, eos_token_id=0
    )
    return tf.GPT2LMHeadModel(config)


class DecoratedQwen2(tf.Qwen2ForCausalLM):  # type: ignore[no-untyped-call]
    """Qwen2 whose ``forward`` carries transformers' ``@deprecate_kwarg``, as Llama's and Qwen2's
    did in earlier releases: a ``*args, **kwargs`` wrapper that receives ``self`` inside ``args``."""

    @deprecate_kwarg("target_ids", version="99.0", new_name="labels")  # type: ignore[untyped-decorator]
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return super().forward(*args, **kwargs)


def _logged(forward: Callable[..., Any]) -> Callable[..., Any]:
    """A user's decorator of the usual shape, ``functools.wraps`` over ``*args, **kwargs``."""

    @functools.wraps(forward)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return forward(*args, **kwargs)

    return wrapper


def _decorated_llama() -> nn.Module:
    """Llama whose ``forward`` is wrapped on the instance, as Accelerate wraps a prepared model's
    for mixed precision (``model.forward = convert_outputs_to_fp32(model.forward)``): Dynamo then
    reaches the model through the wrapper's closure (``L['f'].__self__``)."""
    model = _llama()
    model.forward = _logged(model.forward)
    return model


def _compiled(build: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    return lambda: torch.compile(build())  # type: ignore[return-value]


def _checkpointed(build: Callable[[], nn.Module], reentrant: bool) -> Callable[[], nn.Module]:
    def make() -> nn.Module:
        model = build()
        model.gradient_checkpointing_enable(  # type: ignore[operator]
            gradient_checkpointing_kwargs={"use_reentrant": reentrant}
        )
        return model

    return make


def _text_cases() -> list[Case]:
    return [
        Case("llama", "decoder", _llama, causal_lm),
        Case("gpt2", "decoder", _gpt2, causal_lm),
        Case(
            "qwen2",
            "decoder",
            lambda: tf.Qwen2ForCausalLM(tf.Qwen2Config(**TEXT, num_key_value_heads=2)),
            causal_lm,
        ),
        Case(
            "qwen2-decorated",
            "decoder",
            lambda: DecoratedQwen2(tf.Qwen2Config(**TEXT, num_key_value_heads=2)),
            causal_lm,
        ),
        Case("phi", "decoder", lambda: tf.PhiForCausalLM(tf.PhiConfig(**TEXT)), causal_lm),
        Case("gpt_neox", "decoder", lambda: tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(**TEXT)), causal_lm),
        Case(
            "opt",
            "decoder",
            lambda: tf.OPTForCausalLM(
                tf.OPTConfig(
                    hidden_size=32,
                    ffn_dim=64,
                    num_hidden_layers=LAYERS,
                    num_attention_heads=4,
                    vocab_size=VOCAB,
                    word_embed_proj_dim=32,
                    max_position_embeddings=64,
                )
            ),
            causal_lm,
        ),
        Case(
            "bert",
            "encoder",
            lambda: tf.BertForMaskedLM(tf.BertConfig(**TEXT, max_position_embeddings=64)),
            causal_lm,
        ),
        Case(
            "distilbert",
            "encoder",
            lambda: tf.DistilBertForMaskedLM(
                tf.DistilBertConfig(
                    dim=32,
                    hidden_dim=64,
                    n_layers=LAYERS,
                    n_heads=4,
                    vocab_size=VOCAB,
                    max_position_embeddings=64,
                )
            ),
            causal_lm,
        ),
    ]


def _other_cases() -> list[Case]:
    return [
        Case(
            "t5",
            "encoder-decoder",
            lambda: tf.T5ForConditionalGeneration(
                tf.T5Config(  # type: ignore[call-arg]  # decoder_start_token_id: a generic config key
                    d_model=32,
                    d_ff=64,
                    d_kv=8,
                    num_layers=LAYERS,
                    num_heads=4,
                    vocab_size=VOCAB,
                    decoder_start_token_id=0,
                    pad_token_id=0,
                )
            ),
            seq2seq,
        ),
        Case(
            "bart",
            "encoder-decoder",
            lambda: tf.BartForConditionalGeneration(tf.BartConfig(**SEQ2SEQ)),
            seq2seq,
        ),
        Case(
            "mixtral",
            "moe",
            lambda: tf.MixtralForCausalLM(
                tf.MixtralConfig(**TEXT, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)
            ),
            causal_lm,
        ),
        Case(
            "vit",
            "vision",
            lambda: tf.ViTForImageClassification(
                tf.ViTConfig(
                    hidden_size=32,
                    intermediate_size=64,
                    num_hidden_layers=LAYERS,
                    num_attention_heads=4,
                    image_size=32,
                    patch_size=8,
                    **CLASSIFY,
                )
            ),
            image,
        ),
        Case("convnext", "vision", _convnext, image),
        Case("resnet", "vision", _resnet, image),
        Case(
            "whisper",
            "speech",
            lambda: tf.WhisperForConditionalGeneration(
                tf.WhisperConfig(
                    **{k: v for k, v in SEQ2SEQ.items() if k != "max_position_embeddings"},
                    num_mel_bins=16,
                    max_source_positions=16,
                    max_target_positions=32,
                    pad_token_id=0,
                    bos_token_id=1,
                    eos_token_id=2,
                    decoder_start_token_id=1,
                )
            ),
            mel,
        ),
        Case(
            "wav2vec2",
            "speech",
            lambda: tf.Wav2Vec2ForCTC(
                tf.Wav2Vec2Config(
                    **TEXT,
                    conv_dim=(16, 16),
                    conv_stride=(4, 4),
                    conv_kernel=(8, 8),
                    num_conv_pos_embeddings=8,
                    num_conv_pos_embedding_groups=4,
                )
            ),
            waveform,
        ),
        Case(
            "mamba",
            "state-space",
            lambda: tf.MambaForCausalLM(
                tf.MambaConfig(
                    hidden_size=32, state_size=8, num_hidden_layers=LAYERS, vocab_size=VOCAB, expand=2
                )
            ),
            causal_lm,
        ),
    ]


def _convnext() -> nn.Module:
    config = tf.ConvNextConfig(hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, image_size=32, **CLASSIFY)
    return tf.ConvNextForImageClassification(config)


def _resnet() -> nn.Module:
    config = tf.ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic", **CLASSIFY
    )
    return tf.ResNetForImageClassification(config)


def _training_cases() -> list[Case]:
    checkpointed = [
        Case(
            f"{name}-checkpoint-{'reentrant' if reentrant else 'nonreentrant'}",
            "decoder",
            _checkpointed(build, reentrant),
            causal_lm,
            reentrant=reentrant,
            counted=counted,
        )
        for name, build, counted in (("llama", _llama, "LlamaAttention"), ("gpt2", _gpt2, "GPT2Attention"))
        for reentrant in (True, False)
    ]
    compiled = [
        Case("llama-compiled", "decoder", _compiled(_llama), causal_lm, compiled=True),
        Case("llama-decorated-compiled", "decoder", _compiled(_decorated_llama), causal_lm, compiled=True),
        Case("resnet-compiled", "vision", _compiled(_resnet), image, compiled=True),
    ]
    return checkpointed + compiled


CASES: list[Case] = _text_cases() + _other_cases() + _training_cases()
BY_ID: dict[str, Case] = {case.id: case for case in CASES}
