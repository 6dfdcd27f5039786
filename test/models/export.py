#!/usr/bin/env python3
"""Exports small models of today's torchvision and transformers families (and two hand-written
convolutional nets, a UNet and a DCGAN-style generator) to ONNX, with fp64 references.

Each family is built in a SMALL configuration (real structure, narrow widths,
random initialisation from a fixed seed), exported with both of PyTorch's ONNX
exporters, and written as test/models/<family>-<exporter>.onnx next to
<family>-<exporter>.npz, which holds the inputs, random labels, the fp64 loss
and the fp64 gradient of every ONNX initializer that stands for a torch
parameter. See test/models/README.md (written by this script) for the files.

This needs a current PyTorch, which Debian's python3-torch (1.13) is not; it is
run by hand from a separate virtual environment, never by CI (the generated
files are committed):

    python3 -m venv /work/torchenv
    /work/torchenv/bin/pip install torch torchvision transformers onnx onnxscript onnxruntime
    /work/torchenv/bin/python test/models/export.py [--only NAME] [--out test/models]
    /work/torchenv/bin/python test/models/export.py --readme-only   # table and pipec status only

Exporters (the part of each file name after the family):
  dynamo         torch.onnx.export(dynamo=True) with its defaults (opset 20 and
                 optimize=True in the torch pinned below)
  dynamo-noopt   the same with optimize=False (a few families)
  dynamo-opset23 dynamo=True, opset_version=23 (the tiny Llama, SDPA attention)
  legacy         the TorchScript exporter: dynamo=False, opset_version=17,
                 training=TrainingMode.TRAINING, do_constant_folding=False
Two families are exported in low precision: hf-llama-bf16 (the tiny Llama
built with dtype=torch.bfloat16) and tv-resnet18-fp16 (tv-resnet18 after
.half(), image float16 too). Their references are model.double() of the same
float16/bfloat16 weights (an exact upcast): the exported model's function in
float64, with no rounding to float16/bfloat16 inside, which is what pipec
computes in float32 from float32 master copies of the initializers.
Every model is in train() mode when exported (dropout and stochastic depth 0):
the legacy exporter is told so by `training`, the dynamo exporter reads the
module's mode. Weights are kept inside the .onnx (external_data=False); the
dynamo files lose only their per-node stack-trace metadata (machine paths).

The .npz of each file holds (np.load(path) needs no pickle):
  <graph input name>   the input used (float32 image / int64 token ids; a
                       float16 image, as tv-resnet18-fp16 is exported with, is
                       stored as its float32 upcast, which is exact: pipec
                       imports float16 / bfloat16 graph inputs as float32)
  labels               int64 class ids, shape logits.shape[:-1]
  logits               the fp64 logits (model.double(), train mode)
  loss                 fp64 F.cross_entropy(logits.reshape(-1, C), labels.reshape(-1))
  grad/<initializer>   d loss / d initializer (computed in fp64, stored as
                       float32) for each ONNX initializer
                       that stands for torch parameter(s): the parameter's
                       gradient (transposed when the exporter stored the
                       transpose; summed when the exporter merged several
                       equal-valued parameters into one initializer;
                       permuted alike when the exporter folded a
                       rearrangement of parameters into one, as an RNN's
                       weights with ONNX's gate order)
  meta                 a JSON string: exporter, opset, op counts, versions,
                       the torch parameter count, the initializer <-> parameter
                       map, torch buffers among the initializers, unmapped
                       initializers and parameters with reasons, and
                       onnxruntime's logits against torch's.
"""
import argparse
import ast
import collections
import datetime
import functools
import hashlib
import inspect
import json
import os
import re
import subprocess
import sys
import traceback
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))

# The versions this script was written for and the committed files were made
# with. Other versions are allowed (a warning is printed): the graphs they write
# will differ, which is the point of regenerating.
PINNED = {
    "torch": "2.15.0",
    "torchvision": "0.29.2",
    "transformers": "5.24.0",
    "onnx": "1.23.2",
    "onnxscript": "0.7.2",
    "onnxruntime": "1.32.0",
}

SEED = 0
# Gradients are computed in float64 and stored rounded to float32 (the loss
# and logits stay float64): that rounding (6e-8 relative) is far below any
# float32 training's own error, and halves the references' size.
GRAD_DTYPE = "float32"
IMAGE = (4, 3, 32, 32)       # CNNs: batch 4 (BatchNorm batch statistics over 4 samples)
IMAGE_VIT = (2, 3, 32, 32)   # transformers on images
TOKENS = (2, 16)             # batch 2, sequence 16
VOCAB = 128
CLASSES = 10


def versions():
    import numpy
    import onnx
    import onnxruntime
    import onnxscript
    import torch
    import torchvision
    import transformers
    got = {"torch": torch.__version__, "torchvision": torchvision.__version__,
           "transformers": transformers.__version__, "onnx": onnx.__version__,
           "onnxscript": onnxscript.__version__, "onnxruntime": onnxruntime.__version__,
           "numpy": numpy.__version__}
    return got


def check_versions():
    got = versions()
    print("versions: " + ", ".join(f"{k} {v}" for k, v in got.items()))
    for name, pinned in PINNED.items():
        if got[name].split("+")[0] != pinned:
            print(f"warning: {name} {got[name]} is not the pinned {pinned}; the exported graphs may differ "
                  "from the committed ones", file=sys.stderr)
    return got


# ---------------------------------------------------------------------------
# Families. Each builder returns (model, {input name: tensor}). The model is
# built from torch.manual_seed(SEED), so two calls give equal weights.

def no_dropout(model):
    import torch.nn as nn
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    return model


def image(shape=IMAGE):
    import torch
    g = torch.Generator().manual_seed(SEED + 1)
    return torch.randn(*shape, generator=g)


def tokens(low=0):
    import torch
    g = torch.Generator().manual_seed(SEED + 1)
    return torch.randint(low, VOCAB, TOKENS, generator=g)


def tv_resnet18():
    """ResNet-18's graph (BasicBlock [2,2,2,2], downsample convs, BatchNorm,
    residual adds) at 1/16 of its widths (4-8-16-32 channels).
    torchvision's constructor fixes BasicBlock's width at 64, so a subclass
    narrows the stages and rebuilds the stem and head, initialised as
    torchvision does."""
    import torch.nn as nn
    from torchvision.models.resnet import BasicBlock, ResNet

    div = 16

    class NarrowResNet(ResNet):
        def _make_layer(self, block, planes, blocks, stride=1, dilate=False):
            if planes == 64:
                self.inplanes = 64 // div
            return super()._make_layer(block, planes // div, blocks, stride, dilate)

    model = NarrowResNet(BasicBlock, [2, 2, 2, 2], num_classes=CLASSES)
    model.conv1 = nn.Conv2d(3, 64 // div, kernel_size=7, stride=2, padding=3, bias=False)
    model.bn1 = nn.BatchNorm2d(64 // div)
    model.fc = nn.Linear(512 // div, CLASSES)
    nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
    return model, {"image": image()}


def tv_resnet18_fp16():
    """tv_resnet18 (the same seed, so the same weights before the conversion)
    converted with .half(): every parameter and buffer float16, and the image
    too (the exporters trace a float16 model with a float16 input, so the
    graph input is float16)."""
    model, inputs = tv_resnet18()
    return model.half(), {k: v.half() for k, v in inputs.items()}


def tv_mobilenet_v2():
    """MobileNetV2 at width_mult 0.125; its last 1x1 convolution, fixed at 1280
    channels by torchvision, is rebuilt at 128 (with the head), initialised as
    torchvision does."""
    import torch.nn as nn
    from torchvision.models import MobileNetV2
    from torchvision.ops.misc import Conv2dNormActivation
    model = MobileNetV2(num_classes=CLASSES, width_mult=0.125, dropout=0.0)
    last = model.features[-1][0].in_channels
    model.features[-1] = Conv2dNormActivation(last, 128, kernel_size=1, norm_layer=nn.BatchNorm2d,
                                              activation_layer=nn.ReLU6)
    model.classifier[1] = nn.Linear(128, CLASSES)
    nn.init.kaiming_normal_(model.features[-1][0].weight, mode="fan_out")
    nn.init.normal_(model.classifier[1].weight, 0, 0.01)
    nn.init.zeros_(model.classifier[1].bias)
    return model, {"image": image()}


def tv_mobilenet_v3_small():
    from torchvision.models import mobilenet_v3_small
    return mobilenet_v3_small(num_classes=CLASSES, width_mult=0.125, dropout=0.0), {"image": image()}


def tv_efficientnet_b0():
    from torchvision.models.efficientnet import EfficientNet, _efficientnet_conf
    setting, last_channel = _efficientnet_conf("efficientnet_b0", width_mult=0.125, depth_mult=1.0)
    model = EfficientNet(setting, dropout=0.0, stochastic_depth_prob=0.0, num_classes=CLASSES,
                         last_channel=last_channel)
    return model, {"image": image()}


def tv_densenet121():
    """DenseNet-121's block structure (6, 12, 24, 16), so its 364 parameter
    tensors, with growth rate 4 and 8 initial features."""
    from torchvision.models import DenseNet
    model = DenseNet(growth_rate=4, block_config=(6, 12, 24, 16), num_init_features=8, drop_rate=0.0,
                     num_classes=CLASSES)
    return model, {"image": image()}


def tv_googlenet():
    """GoogLeNet (no auxiliary heads, init_weights=True) with every channel
    count divided by 8: the convolution and inception blocks are wrapped to
    divide their arguments, the 1024-wide head is rebuilt at 128."""
    import torch
    import torch.nn as nn
    from torchvision.models.googlenet import BasicConv2d, GoogLeNet, Inception, InceptionAux

    div = 8

    def conv(in_channels, out_channels, **kwargs):
        return BasicConv2d(in_channels if in_channels == 3 else in_channels // div, out_channels // div, **kwargs)

    def inception(*channels, conv_block=None):
        return Inception(*[c // div for c in channels], conv_block=BasicConv2d)

    model = GoogLeNet(num_classes=CLASSES, aux_logits=False, init_weights=True, dropout=0.0,
                      blocks=[conv, inception, InceptionAux])
    model.fc = nn.Linear(1024 // div, CLASSES)
    torch.nn.init.trunc_normal_(model.fc.weight, mean=0.0, std=0.01, a=-2, b=2)
    return model, {"image": image()}


def tv_shufflenet_v2():
    from torchvision.models import ShuffleNetV2
    model = ShuffleNetV2(stages_repeats=[4, 8, 4], stages_out_channels=[8, 16, 32, 64, 128], num_classes=CLASSES)
    return model, {"image": image()}


def tv_convnext():
    """ConvNeXt-T's four stages at depths [1, 1, 3, 1] (T: [3, 3, 9, 3]) and
    widths 8-16-24-32 (LayerNorm2d, depthwise 7x7, layer scale, GELU,
    stochastic depth 0)."""
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt
    setting = [CNBlockConfig(8, 16, 1), CNBlockConfig(16, 24, 1), CNBlockConfig(24, 32, 3), CNBlockConfig(32, None, 1)]
    return ConvNeXt(setting, stochastic_depth_prob=0.0, num_classes=CLASSES), {"image": image()}


def tv_vit():
    """torchvision initialises the head's weight to zeros, which leaves every
    other gradient zero at the first step: it is drawn (trunc normal, std
    0.02) here instead."""
    import torch.nn as nn
    from torchvision.models import VisionTransformer
    model = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=32, mlp_dim=64,
                              dropout=0.0, attention_dropout=0.0, num_classes=CLASSES)
    nn.init.trunc_normal_(model.heads.head.weight, std=0.02)
    return model, {"image": image(IMAGE_VIT)}


def tv_swin():
    from torchvision.models import SwinTransformer
    model = SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=[4, 4],
                            stochastic_depth_prob=0.0, num_classes=CLASSES)
    return model, {"image": image(IMAGE_VIT)}


@functools.lru_cache(None)
def wrappers():
    import torch
    import torch.nn as nn

    class CausalLM(nn.Module):
        """Returns the logits only. The all-ones attention mask (computed from
        input_ids, as users' export wrappers do) keeps transformers off its
        packed-sequence detection (torch.diff on the position ids), which the
        TorchScript exporter cannot export."""

        def __init__(self, hf):
            super().__init__()
            self.hf = hf

        def forward(self, input_ids):
            return self.hf(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), use_cache=False).logits

    class EncoderLM(nn.Module):
        """BERT / RoBERTa: input_ids only; position and token type ids are made inside."""

        def __init__(self, hf):
            super().__init__()
            self.hf = hf

        def forward(self, input_ids):
            return self.hf(input_ids=input_ids).logits

    class ImageClassifier(nn.Module):
        def __init__(self, hf):
            super().__init__()
            self.hf = hf

        def forward(self, pixel_values):
            return self.hf(pixel_values=pixel_values).logits

    return CausalLM, EncoderLM, ImageClassifier


TINY = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=64)


def hf_causal(config_class, model_class, attn="eager", dtype=None, **overrides):
    """dtype: a torch dtype's name (e.g. "bfloat16") passed to _from_config,
    which then creates and initialises the parameters in that dtype (the
    rotary inv_freq buffers stay float32)."""
    def build():
        import torch
        import transformers
        config = getattr(transformers, config_class)(**dict(TINY, **overrides))
        kwargs = {"dtype": getattr(torch, dtype)} if dtype else {}
        hf = getattr(transformers, model_class)._from_config(config, attn_implementation=attn, **kwargs)
        return wrappers()[0](hf), {"input_ids": tokens()}
    return build


def hf_gpt2():
    import transformers
    config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    hf = transformers.GPT2LMHeadModel._from_config(config, attn_implementation="eager")
    return wrappers()[0](hf), {"input_ids": tokens()}


def hf_encoder(config_class, model_class, **overrides):
    def build():
        import transformers
        config = getattr(transformers, config_class)(
            **dict(TINY, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, type_vocab_size=2, **overrides))
        hf = getattr(transformers, model_class)._from_config(config, attn_implementation="eager")
        # Ids from 4 up: RoBERTa's padding id (1) would change its position ids.
        return wrappers()[1](hf), {"input_ids": tokens(low=4)}
    return build


def hf_vit():
    import transformers
    config = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                                    num_attention_heads=4, intermediate_size=64, hidden_dropout_prob=0.0,
                                    attention_probs_dropout_prob=0.0, num_labels=CLASSES)
    hf = transformers.ViTForImageClassification._from_config(config, attn_implementation="eager")
    return wrappers()[2](hf), {"pixel_values": image(IMAGE_VIT)}


def unet():
    """A small hand-written UNet: two down levels (Conv 3x3 + BatchNorm + ReLU
    twice, then MaxPool 2), a bottleneck double conv, two up levels
    (ConvTranspose2d kernel 2 stride 2, concatenated with the skip, double
    conv), a 1x1 convolution to CLASSES channels; widths 8-16-32. The
    per-pixel logits are permuted to (N, H, W, C), so the loss takes the last
    axis as classes."""
    import torch
    import torch.nn as nn

    def double(cin, cout):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                             nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

    class UNet(nn.Module):
        def __init__(self, widths=(8, 16, 32)):
            super().__init__()
            a, b, c = widths
            self.down1, self.down2 = double(3, a), double(a, b)
            self.pool = nn.MaxPool2d(2)
            self.bottleneck = double(b, c)
            self.up2, self.dec2 = nn.ConvTranspose2d(c, b, 2, stride=2), double(2 * b, b)
            self.up1, self.dec1 = nn.ConvTranspose2d(b, a, 2, stride=2), double(2 * a, a)
            self.head = nn.Conv2d(a, CLASSES, 1)

        def forward(self, image):
            s1 = self.down1(image)                    # 32x32
            s2 = self.down2(self.pool(s1))            # 16x16
            x = self.bottleneck(self.pool(s2))        # 8x8
            x = self.dec2(torch.cat([self.up2(x), s2], dim=1))
            x = self.dec1(torch.cat([self.up1(x), s1], dim=1))
            return self.head(x).permute(0, 2, 3, 1)   # (N, H, W, CLASSES)

    return UNet(), {"image": image()}


LATENT = (4, 16, 4, 4)


def dcgan_generator():
    """A DCGAN-style generator from a (4, 16, 4, 4) latent: ConvTranspose2d
    16->32 (kernel 4, stride 2, padding 1: 8x8), 32->16 (kernel 3, stride 2,
    padding 1, output_padding 1: 16x16), 16->16 (kernel 3, padding 1,
    groups 2), each bias-free with BatchNorm and ReLU, then a ConvTranspose2d
    16->CLASSES head (kernel 4, stride 2, padding 1: 32x32) whose per-pixel
    logits are permuted to (N, H, W, C). DCGAN's initialisation (weights
    N(0, 0.02), BatchNorm scale N(1, 0.02))."""
    import torch
    import torch.nn as nn

    def block(cin, cout, kernel, stride, padding, output_padding=0, groups=1):
        return [nn.ConvTranspose2d(cin, cout, kernel, stride, padding, output_padding, groups=groups, bias=False),
                nn.BatchNorm2d(cout), nn.ReLU()]

    class Generator(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(*block(16, 32, 4, 2, 1), *block(32, 16, 3, 2, 1, output_padding=1),
                                     *block(16, 16, 3, 1, 1, groups=2),
                                     nn.ConvTranspose2d(16, CLASSES, 4, 2, 1))

        def forward(self, latent):
            return self.net(latent).permute(0, 2, 3, 1)

    model = Generator()
    for m in model.modules():
        if isinstance(m, nn.ConvTranspose2d):
            nn.init.normal_(m.weight, 0.0, 0.02)
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.normal_(m.weight, 1.0, 0.02)
            nn.init.zeros_(m.bias)
    g = torch.Generator().manual_seed(SEED + 1)
    return model, {"latent": torch.randn(*LATENT, generator=g)}


CLIP_EOS_POSITION = 11


def hf_clip_text():
    """transformers CLIPTextModel (causal, quick_gelu) with a Linear head on
    pooler_output inside the wrapper. The config keeps eos_token_id=2, as the
    openai/clip-* checkpoints do, so the pooling gathers the position of the
    largest token id (ArgMax of the ids cast to int32): every row holds
    VOCAB-1 (CLIP's end-of-text id is its largest) at position
    CLIP_EOS_POSITION and ids 3..VOCAB-2 elsewhere, so the maximum is unique."""
    import torch
    import torch.nn as nn
    import transformers

    class ClipTextClassifier(nn.Module):
        def __init__(self, text):
            super().__init__()
            self.text = text
            self.head = nn.Linear(text.config.hidden_size, CLASSES)

        def forward(self, input_ids):
            return self.head(self.text(input_ids=input_ids).pooler_output)

    config = transformers.CLIPTextConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, projection_dim=32,
                                         num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=TOKENS[1],
                                         attention_dropout=0.0, pad_token_id=1, bos_token_id=0, eos_token_id=2)
    text = transformers.CLIPTextModel._from_config(config, attn_implementation="eager")
    g = torch.Generator().manual_seed(SEED + 1)
    ids = torch.randint(3, VOCAB - 1, TOKENS, generator=g)
    ids[:, CLIP_EOS_POSITION] = VOCAB - 1
    return ClipTextClassifier(text), {"input_ids": ids}


def hf_funnel():
    """transformers FunnelForMaskedLM: three blocks of one layer (the sequence
    pooled 16 -> 8 -> 4, first token kept apart), one decoder layer that
    upsamples back to 16, relative-shift attention (Einsum); its logits.
    transformers' initialisation (embeddings std 1, tied to the LM head)
    gives large logits: the loss is about 22, not log(VOCAB)."""
    import transformers
    config = transformers.FunnelConfig(vocab_size=VOCAB, block_sizes=[1, 1, 1], num_decoder_layers=1, d_model=32,
                                       n_head=4, d_head=8, d_inner=64, hidden_dropout=0.0, attention_dropout=0.0,
                                       activation_dropout=0.0)
    hf = transformers.FunnelForMaskedLM._from_config(config)
    return wrappers()[1](hf), {"input_ids": tokens()}


def hf_convnextv2():
    """transformers ConvNextV2ForImageClassification, 32px, patch 4, depths
    [1, 1, 2, 1], widths 8-16-24-32. transformers initialises the GRN scale
    and bias to zeros (GRN is then the identity, and the dynamo optimizer
    drops them): they are drawn (normal, std 0.5) here instead, so the
    ReduceL2 path carries a gradient."""
    import torch.nn as nn
    import transformers
    from transformers.models.convnextv2.modeling_convnextv2 import ConvNextV2GRN
    config = transformers.ConvNextV2Config(num_channels=3, patch_size=4, num_stages=4, hidden_sizes=[8, 16, 24, 32],
                                           depths=[1, 1, 2, 1], drop_path_rate=0.0, image_size=32,
                                           num_labels=CLASSES)
    hf = transformers.ConvNextV2ForImageClassification._from_config(config)
    for m in hf.modules():
        if isinstance(m, ConvNextV2GRN):
            nn.init.normal_(m.weight, 0.0, 0.5)
            nn.init.normal_(m.bias, 0.0, 0.5)
    return wrappers()[2](hf), {"pixel_values": image()}


def hf_bart():
    """transformers BartForConditionalGeneration (2 encoder, 2 decoder
    layers, tied embeddings, learned positions); the wrapper derives the
    decoder_input_ids from input_ids (shift_tokens_right, as BartModel does
    when none are given) and returns the decoder's logits."""
    import torch.nn as nn
    import transformers
    from transformers.models.bart.modeling_bart import shift_tokens_right

    class Seq2SeqLM(nn.Module):
        def __init__(self, hf):
            super().__init__()
            self.hf = hf

        def forward(self, input_ids):
            decoder_input_ids = shift_tokens_right(input_ids, self.hf.config.pad_token_id,
                                                   self.hf.config.decoder_start_token_id)
            return self.hf(input_ids=input_ids, decoder_input_ids=decoder_input_ids, use_cache=False).logits

    config = transformers.BartConfig(vocab_size=VOCAB, max_position_embeddings=64, d_model=32, encoder_layers=2,
                                     decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                                     encoder_ffn_dim=64, decoder_ffn_dim=64, dropout=0.0, attention_dropout=0.0,
                                     activation_dropout=0.0, classifier_dropout=0.0)
    hf = transformers.BartForConditionalGeneration._from_config(config, attn_implementation="eager")
    # Ids from 4 up: 0-3 are BART's special tokens (1 the padding id).
    return Seq2SeqLM(hf), {"input_ids": tokens(low=4)}


def torch_lstm():
    """A small sequence tagger written with torch.nn: nn.Embedding(VOCAB, 16)
    on the token ids, a 2-layer bidirectional batch_first nn.LSTM(16, 12)
    (24 features out), a unidirectional nn.GRU(24, 12), nn.Linear(12,
    CLASSES) at every position: logits (2, 16, CLASSES). torch's default
    initialisation (uniform +-1/sqrt(12) for the recurrent weights)."""
    import torch.nn as nn

    class SeqTagger(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, 16)
            self.lstm = nn.LSTM(16, 12, num_layers=2, bidirectional=True, batch_first=True)
            self.gru = nn.GRU(24, 12, batch_first=True)
            self.head = nn.Linear(12, CLASSES)

        def forward(self, input_ids):
            x, _ = self.lstm(self.embed(input_ids))
            x, _ = self.gru(x)
            return self.head(x)

    return SeqTagger(), {"input_ids": tokens()}


DROP = dict(attention_dropout=0.0)
DYN, NOOPT, LEG = "dynamo", "dynamo-noopt", "legacy"

# family -> (builder, exporters, note)
FAMILIES = {
    "tv-resnet18": (tv_resnet18, [DYN, NOOPT, LEG], "torchvision ResNet-18 structure, widths / 16"),
    "tv-resnet18-fp16": (tv_resnet18_fp16, [NOOPT, LEG],
                         "tv-resnet18 converted with .half(): float16 parameters, buffers and image"),
    "tv-mobilenet-v2": (tv_mobilenet_v2, [DYN, LEG], "torchvision MobileNetV2, width_mult 0.125, last conv 128"),
    "tv-mobilenet-v3-small": (tv_mobilenet_v3_small, [DYN, LEG], "torchvision MobileNetV3-Small, width_mult 0.125"),
    "tv-efficientnet-b0": (tv_efficientnet_b0, [DYN, LEG], "torchvision EfficientNet-B0, width_mult 0.125"),
    "tv-densenet121": (tv_densenet121, [DYN, LEG], "torchvision DenseNet-121 blocks, growth 4, 8 initial features"),
    "tv-googlenet": (tv_googlenet, [DYN, LEG], "torchvision GoogLeNet, no aux heads, channels / 8"),
    "tv-shufflenet-v2": (tv_shufflenet_v2, [DYN, LEG], "torchvision ShuffleNetV2, stages [4,8,4], channels 8..128"),
    "tv-convnext": (tv_convnext, [DYN, LEG], "torchvision ConvNeXt, depths [1,1,3,1], dims 8..32"),
    "tv-vit": (tv_vit, [DYN, NOOPT, LEG], "torchvision VisionTransformer, 32px, patch 8, 2 layers, dim 32, head drawn (not zeros)"),
    "tv-swin": (tv_swin, [DYN, LEG], "torchvision SwinTransformer, 32px, dim 16, depths [2,2], window 4"),
    "hf-gpt2": (hf_gpt2, [DYN, LEG], "transformers GPT2LMHeadModel, eager attention"),
    "hf-llama": (hf_causal("LlamaConfig", "LlamaForCausalLM", num_key_value_heads=2, **DROP), [DYN, NOOPT, LEG],
                 "transformers LlamaForCausalLM, grouped-query (4 heads, 2 kv), eager attention"),
    "hf-llama-sdpa": (hf_causal("LlamaConfig", "LlamaForCausalLM", attn="sdpa", num_key_value_heads=2, **DROP),
                      [DYN, "dynamo-opset23"], "the same Llama with SDPA attention (transformers' default)"),
    "hf-llama-bf16": (hf_causal("LlamaConfig", "LlamaForCausalLM", dtype="bfloat16", num_key_value_heads=2, **DROP),
                      [DYN, NOOPT, LEG], "the tiny GQA Llama built with dtype=torch.bfloat16, eager attention"),
    "hf-mistral": (hf_causal("MistralConfig", "MistralForCausalLM", num_key_value_heads=2, **DROP), [DYN, LEG],
                   "transformers MistralForCausalLM, GQA, default sliding window, eager attention"),
    "hf-qwen2": (hf_causal("Qwen2Config", "Qwen2ForCausalLM", num_key_value_heads=2, **DROP), [DYN, LEG],
                 "transformers Qwen2ForCausalLM, GQA, q/k/v biases, eager attention"),
    "hf-gemma": (hf_causal("GemmaConfig", "GemmaForCausalLM", num_key_value_heads=2, head_dim=8, **DROP), [DYN, LEG],
                 "transformers GemmaForCausalLM, GQA, tied embeddings, eager attention"),
    "hf-phi": (hf_causal("PhiConfig", "PhiForCausalLM", resid_pdrop=0.0, embd_pdrop=0.0, **DROP), [DYN, LEG],
               "transformers PhiForCausalLM, partial rotary, eager attention"),
    "hf-bert": (hf_encoder("BertConfig", "BertForMaskedLM"), [DYN, LEG], "transformers BertForMaskedLM, eager attention"),
    "hf-roberta": (hf_encoder("RobertaConfig", "RobertaForMaskedLM", pad_token_id=1), [DYN, LEG],
                   "transformers RobertaForMaskedLM, eager attention"),
    "hf-vit": (hf_vit, [DYN, LEG], "transformers ViTForImageClassification, eager attention"),
    "unet": (unet, [DYN, LEG], "hand-written UNet, 2 levels, widths 8-16-32, ConvTranspose2d up, per-pixel logits (NHWC)"),
    "dcgan-generator": (dcgan_generator, [DYN, LEG],
                        "DCGAN-style ConvTranspose2d decoder from a 16x4x4 latent (output_padding, groups 2), "
                        "per-pixel logits (NHWC)"),
    "hf-clip-text": (hf_clip_text, [DYN, LEG],
                     "transformers CLIPTextModel + Linear head on pooler_output (ArgMax pooling), eager attention"),
    "hf-funnel": (hf_funnel, [DYN, LEG], "transformers FunnelForMaskedLM, blocks [1,1,1], relative-shift attention"),
    "hf-convnextv2": (hf_convnextv2, [DYN, LEG],
                      "transformers ConvNextV2ForImageClassification, 32px, depths [1,1,2,1], GRN drawn (not zeros)"),
    "torch-lstm": (torch_lstm, [DYN, NOOPT, LEG],
                   "torch.nn sequence tagger: Embedding 16, 2-layer bidirectional LSTM 12, GRU 12, Linear per position"),
    "hf-bart": (hf_bart, [DYN, LEG], "transformers BartForConditionalGeneration, decoder ids shifted from input_ids, eager attention"),
}


def build(family):
    import torch
    torch.manual_seed(SEED)
    model, inputs = FAMILIES[family][0]()
    no_dropout(model)
    model.train()
    return model, inputs


# ---------------------------------------------------------------------------
# Export

def export(family, exporter, path):
    import torch
    model, inputs = build(family)
    args = tuple(inputs.values())
    common = dict(input_names=list(inputs), output_names=["logits"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == LEG:
            torch.onnx.export(model, args, path, dynamo=False, opset_version=17,
                              training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False, **common)
        else:
            kwargs = dict(dynamo=True, external_data=False, **common)
            if exporter == NOOPT:
                kwargs["optimize"] = False
            if exporter == "dynamo-opset23":
                kwargs["opset_version"] = 23
            torch.onnx.export(model, args, path, **kwargs)
    if exporter != LEG:
        strip_stack_traces(path)
    return inputs


def strip_stack_traces(path):
    """Drops the dynamo exporter's per-node `pkg.torch.onnx.stack_trace`
    metadata: source paths and lines of the exporting machine (a third of a
    dynamo file here, and different on every machine). All else is kept."""
    import onnx
    model = onnx.load(path)
    for node in model.graph.node:
        keep = [p for p in node.metadata_props if p.key != "pkg.torch.onnx.stack_trace"]
        if len(keep) != len(node.metadata_props):
            del node.metadata_props[:]
            node.metadata_props.extend(keep)
    onnx.save(model, path)


def export_defaults():
    import torch
    params = inspect.signature(torch.onnx.export).parameters
    return {k: repr(params[k].default) for k in ("dynamo", "optimize", "opset_version", "external_data")
            if k in params}


# ---------------------------------------------------------------------------
# Reference and initializer map

def value_key(array):
    import numpy as np
    a = np.ascontiguousarray(array)
    return (str(a.dtype), a.shape, hashlib.sha1(a.tobytes()).hexdigest())


def host(tensor):
    """A torch tensor as a numpy array; float16 and bfloat16 as their float32
    upcast (exact; numpy has no bfloat16), as pipec trains them."""
    import torch
    t = tensor.detach().cpu()
    return (t.float() if t.dtype in (torch.float16, torch.bfloat16) else t).numpy()


def initializer_array(tensor):
    """An ONNX initializer as a numpy array, float16 and bfloat16 upcast to
    float32 (exact), so that they compare with host() of their parameters."""
    import numpy as np
    from onnx import TensorProto, numpy_helper
    arr = numpy_helper.to_array(tensor)
    if tensor.data_type in (TensorProto.FLOAT16, TensorProto.BFLOAT16):
        arr = np.asarray(arr).astype(np.float32)
    return arr


def parameter_aliases(model):
    """{canonical name: [every name of that tensor]} (tied weights have several)."""
    names = collections.OrderedDict()
    ids = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        key = ids.setdefault(id(param), name)
        names.setdefault(key, []).append(name)
    return names


def owner_is_embedding(model, alias):
    import torch.nn as nn
    owner = model.get_submodule(alias.rsplit(".", 1)[0]) if "." in alias else model
    return isinstance(owner, nn.Embedding)


def map_initializers(onnx_model, model):
    """Which torch parameter(s) each ONNX initializer stands for.

    Returns (mapping, notes, param_notes, buffer_inits, rearranged) with mapping =
    {initializer: [(parameter, "same" | "transposed" | "rearranged", [aliases whose use it carries])]}
    and rearranged = {initializer: int64 array of its shape, each element's index
    into the flattened concatenation of its parameters (in mapping's order)}.

    By name first (both exporters keep module paths such as `layer1.0.conv1.weight`
    when they can; a tied weight may carry any of its names), checking the value;
    then by value: an initializer equal to a parameter that has no initializer of
    its own (the legacy exporter's `onnx::MatMul_N`, the dynamo optimizer's folded
    transposes `val_N`), or to its transpose. Several parameters equal to one
    initializer and to no other were merged by the exporter (the dynamo optimizer
    deduplicates equal constants). A tied weight held by two initializers (one
    read by Gather, one by MatMul) was untied by the exporter: each carries the
    gradient of its own use. Last, an initializer whose elements are, each once,
    all the elements of some parameters left over rearranges them (the dynamo
    optimizer's folded RNN weights: gates reordered, directions stacked)."""
    import numpy as np
    import torch.nn as nn

    aliases = parameter_aliases(model)
    params = {n: host(p) for n, p in model.named_parameters()}
    buffers = {n: host(b) for n, b in model.named_buffers()}
    inits = {t.name: initializer_array(t) for t in onnx_model.graph.initializer}
    readers = collections.defaultdict(set)   # initializer -> op types reading it
    # initializer -> module paths of the nodes reading it (the dynamo exporter's
    # node metadata; the legacy exporter keeps parameter names and never merges)
    scopes = collections.defaultdict(set)
    for node in onnx_model.graph.node:
        # The innermost module whose forward ran the op: name_scopes lists the
        # module paths outward-in and ends with the op's own name.
        paths = set()
        meta = {p.key: p.value for p in node.metadata_props}
        if "pkg.torch.onnx.name_scopes" in meta:      # dynamo: ['', 'hf', 'hf.model', ..., 'addmm']
            try:
                names = ast.literal_eval(meta["pkg.torch.onnx.name_scopes"])
                paths = {names[-2]} if len(names) >= 2 else set()
            except (ValueError, SyntaxError):
                paths = set()
        for name in node.input:
            readers[name].add(node.op_type)
            if paths:
                scopes[name] |= paths
            else:
                scopes[name].add(None)                 # a reader without scope: scopes unusable

    def module_of(alias):
        return alias.rsplit(".", 1)[0] if "." in alias else ""

    def runs(scope, module):
        """An op of `scope`'s forward may use `module`'s parameters (its own or a descendant's:
        nn.MultiheadAttention's forward reads out_proj.weight)."""
        return scope == module or scope == "" or module.startswith(scope + ".")

    def reads(init, name):
        return any(runs(scope, module_of(a)) for scope in scopes[init] for a in aliases[name])

    def scoped(init):
        return bool(scopes.get(init)) and None not in scopes[init]

    def absent(n):
        owner = model.get_submodule(n.rsplit(".", 1)[0]) if "." in n else model
        return "no initializer holds its value: " + (
            "a BatchNorm parameter, fused into the preceding convolution by the optimizer"
            if isinstance(owner, nn.modules.batchnorm._BatchNorm) else
            "an all-zero parameter, dropped (a zero bias) or folded into a constant" if not params[n].any() else
            "folded into a derived constant or fused")

    mapping = {}        # initializer -> [(param, how, [aliases])]
    notes = {}          # initializer -> reason (not a parameter)
    param_notes = {}    # param -> where it went
    claimed = set()

    by_value = collections.defaultdict(list)   # key -> [(init, how)]
    for name, arr in inits.items():
        if arr.dtype.kind != "f":
            continue
        by_value[value_key(arr)].append((name, "same"))
        if arr.ndim == 2:
            by_value[value_key(arr.T)].append((name, "transposed"))

    # 1. By name (any alias), checking the value, and (where the nodes carry
    # module scopes) that the parameter's module reads it: the dynamo optimizer
    # keeps one name for the equal constants it merges.
    for name, arr in params.items():
        hit = next((a for a in aliases[name] if a in inits), None)
        if hit is None:
            continue
        claimed.add(hit)
        if not (inits[hit].shape == arr.shape and np.array_equal(inits[hit], arr)):
            notes[hit] = ("named after parameter '" + name + "' but holds other values "
                          "(the exporter folded something into it, e.g. BatchNorm into Conv)")
            param_notes[name] = f"initializer '{hit}' holds a different value (folded); no gradient stored"
        elif scoped(hit) and not reads(hit, name):
            mapping.setdefault(hit, [])
            param_notes[name] = absent(name) + f" (initializer '{hit}' carries its name, not its use)"
        else:
            mapping[hit] = [(name, "same", aliases[name])]
            param_notes[name] = f"initializer '{hit}'"

    # 2. By value, for the parameters left: where the nodes carry module scopes,
    # a parameter belongs to the equal initializer its module reads; otherwise
    # to the one equal initializer nobody else claims.
    groups = collections.defaultdict(list)
    for name, arr in params.items():
        if name not in param_notes:
            groups[value_key(arr)].append(name)
    for key, names in groups.items():
        holders = [(i, how) for i, how in by_value.get(key, []) if i not in notes]
        cands = [(i, how) for i, how in holders if i not in claimed]
        named = [(i, how) for i, how in holders if i in mapping]
        if len(names) == 1 and len(aliases[names[0]]) > 1 and len(holders) > 1:
            continue  # a tied weight held twice: step 3
        if holders and all(scoped(i) for i, _ in holders):
            for n in names:
                hits = [(i, how) for i, how in holders if reads(i, n)]
                if len(hits) == 1:
                    init, how = hits[0]
                    mapping.setdefault(init, []).append((n, how, aliases[n]))
                    claimed.add(init)
                    param_notes[n] = f"initializer '{init}'" + (" (transposed)" if how == "transposed" else "")
                elif not hits:
                    param_notes[n] = absent(n)
                else:
                    param_notes[n] = ("ambiguous: its module reads " + ", ".join(i for i, _ in hits) +
                                      "; no gradient stored")
            continue
        if len(cands) == 1:
            init, how = cands[0]
            mapping[init] = [(n, how, aliases[n]) for n in names]
            claimed.add(init)
            for n in names:
                param_notes[n] = f"initializer '{init}'" + (" (transposed)" if how == "transposed" else "")
        elif not cands and len(named) == 1:
            init, how = named[0]
            mapping[init] += [(n, how, aliases[n]) for n in names]
            for n in names:
                param_notes[n] = f"initializer '{init}'"
        elif not cands and not named:
            for n in names:
                param_notes[n] = absent(n)
        else:
            for n in names:
                param_notes[n] = ("ambiguous: equal to " + ", ".join(f"{i} ({h})" for i, h in cands + named) +
                                  "; no gradient stored")
    # Several parameters in one initializer: merged by the exporter.
    for init, entries in mapping.items():
        if len(entries) > 1:
            for n, _, _ in entries:
                param_notes[n] = (f"merged into initializer '{init}' with {len(entries) - 1} other equal "
                                  "parameter(s) (the exporter deduplicated equal constants)")

    # 3. A parameter whose value is held by further initializers: a tied weight
    # the exporter untied (each use its own initializer), or a plain copy.
    for name, arr in params.items():
        holders = [(i, how) for i, how in by_value.get(value_key(arr), [])
                   if i not in notes and (i not in claimed or any(e[0] == name for e in mapping.get(i, [])))]
        if len(holders) < 2:
            continue
        if len(aliases[name]) > 1:
            embedding = [a for a in aliases[name] if owner_is_embedding(model, a)]
            others = [a for a in aliases[name] if a not in embedding]
            for init, how in holders:
                if scoped(init):
                    use = [a for a in aliases[name] if any(runs(sc, module_of(a)) for sc in scopes[init])]
                if not scoped(init) or not use:
                    use = embedding if "Gather" in readers[init] else others
                mapping[init] = [(name, how, use)]
                claimed.add(init)
            param_notes[name] = ("tied weight untied by the exporter: " +
                                 ", ".join(f"'{i}' ({h}, read by {'/'.join(sorted(readers[i]))})" for i, h in holders) +
                                 "; each grad/ entry is the gradient of its own use")
        else:
            for init, how in holders:
                if init not in mapping:
                    notes[init] = f"a second copy of parameter '{name}' ({how}); no gradient stored"
                    claimed.add(init)
    for init in [i for i, e in mapping.items() if not e]:
        del mapping[init]
        notes[init] = "named after a parameter whose module does not read it (see meta['parameters'])"

    # 4. An initializer that rearranges whole parameters: each of its elements
    # is an element of a parameter no initializer holds, each element of those
    # parameters is in it once (the dynamo optimizer folds an RNN's gate
    # reordering, torch's i,f,g,o to ONNX's i,o,f,c by Slice/Concat, and the
    # stacking of its directions and of its two biases into new initializers).
    # Elements are matched by value; a value found at several places (random
    # float32 weights repeat a value now and then) is resolved among the
    # parameters its unambiguous neighbours name, then by contiguity (the
    # rearrangement moves runs of elements): unresolved, no match.
    # Its gradient is the parameters' gradients at the same places.
    rearranged = {}    # initializer -> index into the concatenation of its parameters, flattened
    where = collections.defaultdict(list)    # value -> [(parameter, flat index)]
    for n, arr in params.items():
        if param_notes.get(n, "").startswith("no initializer holds its value"):
            for j, v in enumerate(arr.reshape(-1).tolist()):
                where[v].append((n, j))
    for name, arr in inits.items():
        if name in mapping or name in notes or name in buffers or arr.dtype.kind != "f" or arr.size < 2:
            continue
        cands = [where.get(v, []) for v in arr.reshape(-1).tolist()]
        if not all(cands):
            continue
        involved = list(dict.fromkeys(c[0][0] for c in cands if len(c) == 1))
        cands = [[(n, j) for n, j in c if n in involved] for c in cands]
        places = [c[0] if len(c) == 1 else None for c in cands]
        progress = True
        while progress and None in places:
            progress = False
            used = set(places)
            for k, c in enumerate(cands):
                if places[k] is None:
                    left = [(n, j) for n, j in c if (n, j) not in used]
                    if len(left) > 1:
                        left = [(n, j) for n, j in left if (k > 0 and places[k - 1] == (n, j - 1)) or
                                (k + 1 < len(places) and places[k + 1] == (n, j + 1))]
                    if len(left) == 1:
                        places[k], progress = left[0], True
                        used.add(left[0])
        if (None in places or len(set(places)) != len(places)
                or len(places) != sum(params[n].size for n in involved)
                or any(params[n].dtype != arr.dtype for n in involved)):
            continue
        offset, start = 0, {}
        for n in involved:
            start[n], offset = offset, offset + params[n].size
        rearranged[name] = np.array([start[n] + j for n, j in places], dtype=np.int64).reshape(arr.shape)
        mapping[name] = [(n, "rearranged", aliases[n]) for n in involved]
        for n in involved:
            param_notes[n] = (f"rearranged into initializer '{name}' {list(arr.shape)}" +
                              (" with " + ", ".join(m for m in involved if m != n) if len(involved) > 1 else "") +
                              " (a permutation of their elements)")
        taken = set(places)
        for v in set(arr.reshape(-1).tolist()):
            where[v] = [p for p in where[v] if p not in taken]

    # Torch buffers, and constants derived from a parameter.
    buffer_inits = {}
    buffer_keys = collections.defaultdict(list)
    for n, b in buffers.items():
        buffer_keys[value_key(b)].append(n)
    value_sets = {n: set(np.unique(a).tolist()) for n, a in params.items() if np.unique(a).size > 8}
    for name, arr in inits.items():
        if name in mapping or name in notes:
            continue
        if name in buffers:
            buffer_inits[name] = name
        elif value_key(arr) in buffer_keys and arr.size > 1:
            buffer_inits[name] = "equal to buffer(s) " + ", ".join(buffer_keys[value_key(arr)][:4])
        else:
            derived = []
            if arr.dtype.kind == "f" and arr.size > 8:
                values = set(np.unique(arr).tolist())
                derived = [n for n, vs in value_sets.items()
                           if param_notes.get(n, "").startswith("no initializer") and values <= vs]
            if derived:
                notes[name] = (f"derived from parameter '{derived[0]}' {list(params[derived[0]].shape)} "
                               f"(the exporter folded a gather/slice/broadcast of it into a constant "
                               f"{list(arr.shape)}); not trainable as exported")
                param_notes[derived[0]] = f"folded into the derived constant '{name}' {list(arr.shape)}"
            else:
                notes[name] = ("exporter constant " + str(list(arr.shape)) + " " + str(arr.dtype) +
                               (" (not a float tensor)" if arr.dtype.kind != "f" else ""))
    return mapping, notes, param_notes, buffer_inits, rearranged


def reference(family, inputs, onnx_model):
    """fp64 logits, loss and gradients of a fresh copy in train mode. The
    gradient of each alias of a tied weight is computed apart
    (torch.func.functional_call with tie_weights=False); a parameter's gradient
    is the sum over its aliases.

    A float16 / bfloat16 family's fresh copy holds the very weights that were
    exported (same seed; map_initializers checks each against the file's
    initializers before the conversion), and model.double() upcasts them
    exactly, as it does the float16 inputs: the reference is the exported
    model's function evaluated in float64 (no rounding to float16 / bfloat16
    inside), the oracle for pipec, which trains float32 master copies and
    computes in float32."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    model, _ = build(family)
    mapping, notes, param_notes, buffer_inits, rearranged = map_initializers(onnx_model, model)
    model.double()
    args = [t.double() if t.is_floating_point() else t for t in inputs.values()]
    aliases = parameter_aliases(model)
    params = dict(model.named_parameters())
    leaves = {a: params[n].detach().clone().requires_grad_(True) for n, names in aliases.items() for a in names}
    logits = torch.func.functional_call(model, leaves, tuple(args), tie_weights=False, strict=False)
    C = logits.shape[-1]
    g = torch.Generator().manual_seed(SEED + 2)
    labels = torch.randint(0, C, logits.shape[:-1], generator=g)
    loss = F.cross_entropy(logits.reshape(-1, C), labels.reshape(-1))
    grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
    grad_of = {a: (np.zeros(tuple(leaves[a].shape)) if gr is None else gr.detach().numpy())
               for a, gr in zip(leaves, grads)}
    out = {}
    for init, entries in mapping.items():
        if init in rearranged:
            flat = np.concatenate([np.reshape(sum(grad_of[a] for a in use), -1) for _, _, use in entries])
            out["grad/" + init] = flat[rearranged[init]]
            continue
        total = None
        for pname, how, use in entries:
            gr = sum(grad_of[a] for a in use)
            gr = gr.T if how == "transposed" else gr
            total = gr if total is None else total + gr
        out["grad/" + init] = total
    return model, labels.numpy(), logits.detach().numpy(), float(loss), out, mapping, notes, param_notes, buffer_inits


def onnxruntime_check(path, inputs, family):
    """Max |onnxruntime logits - torch fp32 logits| in train and in eval mode."""
    import numpy as np
    import onnxruntime
    import torch
    try:
        options = onnxruntime.SessionOptions()
        options.log_severity_level = 3
        session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        got = session.run(None, {k: v.numpy() for k, v in inputs.items()})[0]
        got = np.asarray(got).astype(np.float32) if np.asarray(got).dtype != np.float32 else got
    except Exception as e:  # noqa: BLE001
        return {"error": str(e).splitlines()[0][:300]}
    result = {}
    for mode in ("train", "eval"):
        model, _ = build(family)
        model.train(mode == "train")
        with torch.no_grad():
            want = host(model(*inputs.values()))
        result[f"max_abs_diff_vs_torch_{mode}"] = float(np.abs(got - want).max()) if got.shape == want.shape else \
            f"shape {list(got.shape)} vs {list(want.shape)}"
    return result


def op_counts(onnx_model):
    counts = collections.Counter()
    for node in onnx_model.graph.node:
        counts[(node.domain + "::" if node.domain not in ("", "ai.onnx") else "") + node.op_type] += 1
    for func in onnx_model.functions:   # local functions, if the exporter wrote any
        counts["(function) " + func.name] += 1
    return dict(sorted(counts.items()))


def batchnorm_forms(onnx_model):
    forms = collections.Counter()
    for node in onnx_model.graph.node:
        if node.op_type == "BatchNormalization":
            training = any(a.name == "training_mode" and a.i == 1 for a in node.attribute)
            forms["training_mode=1" if training else f"inference ({len(node.output)} output)"] += 1
    return dict(forms)


def export_one(family, exporter, out_dir, got_versions):
    import numpy as np
    import onnx

    stem = f"{family}-{exporter}"
    path = os.path.join(out_dir, stem + ".onnx")
    inputs = export(family, exporter, path)
    onnx_model = onnx.load(path)
    graph_inputs = [i.name for i in onnx_model.graph.input]
    opset = next((o.version for o in onnx_model.opset_import if o.domain in ("", "ai.onnx")), None)
    model, labels, logits, loss, grads, mapping, notes, param_notes, buffer_inits = \
        reference(family, inputs, onnx_model)
    n_tensors = sum(1 for p in model.parameters() if p.requires_grad)
    n_elems = sum(p.numel() for p in model.parameters() if p.requires_grad)
    meta = {
        "file": stem + ".onnx",
        "family": family,
        "description": FAMILIES[family][2],
        "exporter": exporter,
        "export_call": {
            LEG: "torch.onnx.export(model, args, f, dynamo=False, opset_version=17, "
                 "training=TrainingMode.TRAINING, do_constant_folding=False)",
            DYN: "torch.onnx.export(model, args, f, dynamo=True, external_data=False)  # defaults otherwise",
            NOOPT: "torch.onnx.export(model, args, f, dynamo=True, optimize=False, external_data=False)",
            "dynamo-opset23": "torch.onnx.export(model, args, f, dynamo=True, opset_version=23, external_data=False)",
        }[exporter],
        "export_defaults": export_defaults(),
        "opset": opset,
        "other_opsets": {o.domain: o.version for o in onnx_model.opset_import if o.domain not in ("", "ai.onnx")},
        "ir_version": onnx_model.ir_version,
        "producer": f"{onnx_model.producer_name} {onnx_model.producer_version}",
        "graph_inputs": graph_inputs,
        "op_counts": op_counts(onnx_model),
        "nodes": len(onnx_model.graph.node),
        "batchnorm": batchnorm_forms(onnx_model),
        "initializers": len(onnx_model.graph.initializer),
        "versions": got_versions,
        "torch_trainable_tensors": n_tensors,
        "torch_trainable_elements": n_elems,
        "initializer_to_parameters": {
            i: [p + (f" ({h})" if h in ("transposed", "rearranged") else "") +
                (f" (the use through {', '.join(u)})" if len(parameter_aliases(model)[p]) != len(u) else "")
                for p, h, u in e] for i, e in mapping.items()},
        "parameters": param_notes,
        "torch_buffers_among_initializers": buffer_inits,
        "unmapped_initializers": notes,
        "onnxruntime": onnxruntime_check(path, inputs, family),
        "loss": loss,
    }
    dtypes = collections.Counter(str(p.dtype).replace("torch.", "") for p in build(family)[0].parameters())
    if set(dtypes) != {"float32"}:
        meta["parameter_dtypes"] = dict(dtypes)
        meta["reference_precision"] = ("model.double() of the exported weights (an exact upcast) on the inputs "
                                       "upcast exactly; float16/bfloat16 inputs are stored as their float32 upcast")
    arrays = {}
    for name, tensor in inputs.items():
        if name not in graph_inputs:
            meta.setdefault("warnings", []).append(f"input '{name}' is not a graph input ({graph_inputs})")
        if str(tensor.dtype) in ("torch.float16", "torch.bfloat16"):
            meta.setdefault("input_dtypes", {})[name] = (str(tensor.dtype).replace("torch.", "") +
                                                         " when exported, stored as float32 (exact)")
        arrays[name] = host(tensor)
    arrays["labels"] = labels.astype(np.int64)
    arrays["logits"] = logits.astype(np.float64)
    arrays["loss"] = np.array(loss, dtype=np.float64)
    arrays.update({k: np.asarray(v, dtype=np.float64).astype(GRAD_DTYPE) for k, v in grads.items()})
    arrays["meta"] = np.array(json.dumps(meta, indent=1, sort_keys=True))
    np.savez_compressed(os.path.join(out_dir, stem + ".npz"), **arrays)
    return meta


# ---------------------------------------------------------------------------
# README

def pipec_status(pipec, path):
    """Imports the file with pipec: (ok, summary)."""
    try:
        run = subprocess.run([pipec, path], capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        return False, "timed out after 600 s", []
    except OSError as e:
        return False, f"could not run pipec: {e}", []
    text = (run.stdout + run.stderr).strip()
    if run.returncode == 0:
        params = re.search(r"parameters: ([^\n]*)", text)
        return True, "imports" + (f" (parameters: {params.group(1).strip()})" if params else ""), []
    lacking = sorted(set(re.findall(r"node '[^']*' \(((?:[\w.]+::)?\w+)(?:\)| version| does)", text)))
    return False, " ".join(text.split())[:300], lacking


PARAM_KINDS = [  # (column, prefix of the parameter's note in meta["parameters"])
    ("by name", "initializer '"),
    ("merged", "merged into"),
    ("tied, untied", "tied weight untied"),
    ("conv with BN folded in", "initializer '"),   # refined below ("holds a different value")
    ("BN fused away", "no initializer holds its value: a BatchNorm"),
    ("zero, dropped", "no initializer holds its value: an all-zero"),
    ("folded into a constant", "folded into the derived"),
    ("rearranged", "rearranged into"),
    ("other / ambiguous", ""),
]


# Written by hand from the files of the pinned versions (the tables above are
# computed); check it again when the versions change.
OBSERVATIONS = """
## What the exporters write (pinned versions)

- **BatchNorm, dynamo**: a model in `train()` mode is exported with
  `BatchNormalization` in its inference form (one output, running statistics,
  no `training_mode`): onnxruntime's logits equal torch's in `eval()` mode, not
  in `train()` mode (the table above), so the loss and gradients of a dynamo
  file with BatchNorm are not those of training. With `optimize=True` (the
  default) the optimizer then folds each BatchNorm into the preceding
  convolution: the convolution's initializer keeps the torch name
  (`layer1.0.conv1.weight`) but holds the folded weight, the BatchNorm
  parameters and the all-zero folded biases are gone. DenseNet's pre-activation
  BatchNorms (BN before conv) stay, in inference form. The legacy exporter writes
  `training_mode=1` with three outputs (running statistics updated).
- **optimize=True** also: merges equal-valued initializers into one (a fresh
  model's LayerNorm/RMSNorm weights are all ones, its biases all zeros: 25 of
  BERT's 42 parameters share 3 initializers, Llama's five RMSNorm weights one); drops
  all-zero biases (GPT-2's `c_attn`/`c_fc`/`c_proj` biases, classifier biases);
  folds `Transpose(W)` of every linear weight into a new initializer `val_N`
  (the name is lost, the value is W transposed); unties tied embeddings (the
  embedding Gather reads one initializer, the output MatMul a folded transposed
  copy: GPT-2, Gemma, BERT, RoBERTa); and folds computations on parameters into
  constants that are then no parameter at all: position embeddings gathered at
  the constant positions (GPT-2 `wpe`, BERT), HF ViT's class token expanded to
  the batch, Swin's relative position bias tables gathered by their index,
  Gemma's `1 + weight` RMSNorm scale. Training such a file trains another model.
- **optimize=False** keeps one initializer per parameter under its torch name,
  but writes the bias of a bias-free convolution as `Expand(CastLike(0))` and
  Llama's causal mask with `Range`/`GatherND`/`Max`/`LessOrEqual`/`And` at run time.
- **Opsets**: dynamo writes opset 20 by default; `opset_version=23` on the
  SDPA Llama gives `Attention` and `RMSNormalization` (also for eager
  attention's RMSNorm), never `RotaryEmbedding` (transformers applies rotary
  embeddings with Mul/Neg/Slice/Concat).
- **legacy**: transformers' packed-sequence detection (`torch.diff` of the
  position ids, when no attention mask is given) cannot be exported (aten::diff):
  hence the all-ones mask. Its graphs are long (Constant/Unsqueeze/Concat shape
  chains; rotary `Cos`/`Sin` evaluated at run time from constant positions).
- **Ops from model code**: RoBERTa's padding-aware position ids give
  `Not`/`CumSum`/`GatherElements` on `input_ids` in both exporters; Swin's
  shifted-window mask gives `ScatterND` (dynamo) from `slice_scatter`;
  MobileNetV2 `Clip` (ReLU6), MobileNetV3 `HardSwish`/`HardSigmoid`; CLIP's
  pooling `ArgMax` (of the ids cast to int32) then `GatherND` (dynamo) or
  `Gather` (legacy); Funnel `Einsum` (relative-shift attention), `AveragePool`
  (sequence pooling) and, dynamo, `ScatterND`; ConvNeXt V2's GRN `ReduceL2`;
  UNet and DCGAN `ConvTranspose` (with `output_padding` and `group`).
- **Buffers that look like parameters**: BART's `final_logits_bias` is a
  float buffer (zeros) added to the logits. The legacy file holds it as an
  initializer read by `Add`, like a bias: nothing in the file says it is not
  trained (the dynamo file names it a buffer in its graph signature). The
  dynamo optimizer folds BART's encoder and cross-attention masks, all zeros
  without padding, into an initializer `where` [2, 1, 16, 16] read by `Add`
  before `Softmax`.
- **bfloat16 / float16 files**: the initializers keep the model's dtype;
  transformers' float32 islands (RMSNorm, softmax, rotary tables) become
  `Cast` nodes to FLOAT and back. The legacy exporter and the dynamo
  optimizer store Llama's attention scale 1/sqrt(8) as a bfloat16 constant,
  0.353515625 instead of 0.35355339 (relative 1.1e-4), where torch's
  bfloat16 `Mul` by a Python scalar computes with it in float32: the legacy
  file is another function at that level, its gradients differ from the
  float64 reference by 1.07e-4 of the largest (2e-7 against a reference with
  the rounded scale). `optimize=False` keeps it float32 (a FLOAT Constant).
  The optimizer's folded rotary tables (`unsqueeze_14`/`_15`) are bfloat16
  initializers: cos/sin rounded to bfloat16, as torch's bfloat16 model
  rounds them, where the float64 reference does not.
  onnxruntime's CPU provider lacks bfloat16 kernels for these graphs
  (`NOT_IMPLEMENTED` for Mul, Expand, Where): the bfloat16 rows of the first
  table show its error.
- **RNNs** (`torch-lstm`): both exporters write `nn.LSTM` / `nn.GRU` as ONNX
  `LSTM` / `GRU` nodes (one per layer, `direction=bidirectional` for a
  bidirectional layer; GRU with `linear_before_reset=1`, as torch computes it),
  with zero initial states. ONNX orders the gates i,o,f,c (LSTM) and z,r,h
  (GRU) where torch has i,f,g,o and r,z,n, and stacks the directions and the
  two biases: the legacy exporter and `optimize=False` keep one initializer per
  torch parameter, under its name, and reorder them in the graph
  (`Slice`/`Concat`/`Unsqueeze`); `optimize=True` folds that into new
  initializers `val_N` ([directions, 4*hidden, input], [directions, 8*hidden]
  for the biases), each a permutation of the elements of several parameters.
  Their gradients are the parameters' gradients permuted alike, so the
  reference maps them (by value: column "rearranged" above). It also writes
  the zero initial states as float initializers (`val_16` [2, 2, 12], the
  initial_h and initial_c of both LSTM layers, and the GRU's `val_244`), which
  stand for no parameter (torch's default h0 = c0 = 0) and look like one.
- The optimizer prints `Evaluation failed: cannot reshape array of size 1 into
  shape (1,16)` while exporting BERT (harmless to the file).
""".split("\n")


def parameter_kinds(meta):
    counts = collections.Counter()
    for note in meta["parameters"].values():
        if note.startswith("initializer '") and "holds a different value" in note:
            counts["conv with BN folded in"] += 1
        elif note.startswith("initializer '"):
            counts["by name" if "(transposed)" not in note else "transposed"] += 1
        else:
            kind = next((k for k, prefix in PARAM_KINDS[1:] if prefix and note.startswith(prefix)),
                        "other / ambiguous")
            counts[kind] += 1
    return counts


def reference_check(pipec_reference, path):
    """Runs pipec-reference (pipec's own evaluator, with autodiff) on the file
    with the .npz inputs and labels; compares its loss and gradients with the
    torch reference. Returns a short string."""
    import tempfile
    import numpy as np
    stem = path[:-len(".onnx")]
    with np.load(stem + ".npz") as data, tempfile.TemporaryDirectory() as tmp:
        meta = json.loads(str(data["meta"]))
        command = [pipec_reference, path, "--loss", "softmax-cross-entropy", "--output-dir", os.path.join(tmp, "out")]
        for name in meta["graph_inputs"] + ["labels"]:
            np.save(os.path.join(tmp, name + ".npy"), data[name])
            command += ["--input", f"{name}={os.path.join(tmp, name + '.npy')}"]
        try:
            run = subprocess.run(command, capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            return "pipec-reference timed out"
        except OSError as e:
            return f"could not run pipec-reference: {e}"
        if run.returncode != 0:
            return "pipec-reference fails: " + " ".join((run.stdout + run.stderr).split())[:200]
        out = os.path.join(tmp, "out")
        grads = {}
        with open(os.path.join(out, "index.txt")) as index:
            for line in index:
                parts = line.rstrip("\n").split(" ", 1)
                if len(parts) == 2 and parts[0].startswith("grad_"):
                    grads[parts[1]] = parts[0]
        loss = float(np.load(os.path.join(out, "loss.npy")))
        stored = [k for k in data.files if k.startswith("grad/")]
        # Relative to each reference gradient's largest value, floored at 1e-4 of
        # the largest of all (gradients that are zero in exact arithmetic, such as
        # a key projection's bias, are rounding noise in both).
        floor = 1e-4 * max([float(np.abs(data[k]).max()) for k in stored] + [1e-30])
        worst, worst_name, compared = 0.0, "", 0
        for key in stored:
            if key[5:] in grads:
                ours, want = np.load(os.path.join(out, grads[key[5:]])), data[key]
                if ours.shape != want.shape:
                    return f"loss {loss:.6g} vs {float(data['loss']):.6g}; grad {key[5:]} shape {list(ours.shape)} vs {list(want.shape)}"
                error = float(np.abs(ours - want).max() / max(float(np.abs(want).max()), floor))
                if error > worst:
                    worst, worst_name = error, key[5:]
                compared += 1
        return (f"loss {loss:.6g} vs {float(data['loss']):.6g}; {compared}/{len(stored)} grads compared "
                f"(pipec trains {len(grads)}), worst relative error {worst:.1e}" +
                (f" ({worst_name})" if worst > 1e-3 else ""))


def write_readme(out_dir, pipec):
    import numpy as np
    metas = []
    for name in sorted(os.listdir(out_dir)):
        if name.endswith(".npz"):
            with np.load(os.path.join(out_dir, name)) as data:
                metas.append(json.loads(str(data["meta"])))
    status, checks = {}, {}
    if pipec and os.path.exists(pipec):
        pipec_reference = os.path.join(os.path.dirname(pipec), "pipec-reference")
        for meta in metas:
            path = os.path.join(out_dir, meta["file"])
            status[meta["file"]] = pipec_status(pipec, path)
            if status[meta["file"]][0] and os.path.exists(pipec_reference):
                checks[meta["file"]] = reference_check(pipec_reference, path)
    census = collections.Counter()
    for meta in metas:
        for op in meta["op_counts"]:
            census[op] += 1
    total = sum(os.path.getsize(os.path.join(out_dir, f)) for f in os.listdir(out_dir)
                if f.endswith((".onnx", ".npz")))
    defaults = metas[0]["export_defaults"] if metas else export_defaults()
    lines = [
        "# Test models from today's exporters",
        "",
        "Small models of the families people train today, exported to ONNX with both of",
        "PyTorch's exporters, each with a reference computed in float64 (inputs, labels,",
        "logits, loss, and the gradient of every initializer that stands for a torch",
        "parameter). `export.py` in this directory writes them, and this file, from a",
        "separate virtual environment with a current PyTorch; CI never runs it (Debian's",
        "python3-torch is 1.13), it can only read the committed files.",
        "",
        "Regenerate (deterministic: fixed seeds; other versions write other graphs):",
        "",
        "    python3 -m venv /work/torchenv",
        "    /work/torchenv/bin/pip install torch torchvision transformers onnx onnxscript onnxruntime",
        "    /work/torchenv/bin/python test/models/export.py [--only FAMILY] [--out test/models]",
        "    /work/torchenv/bin/python test/models/export.py --readme-only   # this file only",
        "",
        "Pinned versions (another version prints a warning, not an error): " +
        ", ".join(f"{k} {v}" for k, v in PINNED.items()) + ".",
        "",
        "## Exporters (the suffix of each file name)",
        "",
        "- `dynamo`: `torch.onnx.export(..., dynamo=True, external_data=False)`, otherwise the",
        "  defaults of the pinned torch (" + ", ".join(f"`{k}={v}`" for k, v in defaults.items()) +
        "); it writes opset " + ", ".join(str(o) for o in sorted({m["opset"] for m in metas if m["exporter"] == DYN})) +
        ".",
        "- `dynamo-noopt`: the same with `optimize=False` (ResNet-18 and its float16 copy, torchvision ViT,",
        "  Llama and its bfloat16 copy).",
        "- `dynamo-opset23`: `dynamo=True, opset_version=23` (Llama with SDPA attention).",
        "- `legacy`: the TorchScript exporter, `dynamo=False, opset_version=17,",
        "  training=TrainingMode.TRAINING, do_constant_folding=False`.",
        "",
        "Every model is in `train()` mode when exported, with dropout and stochastic",
        "depth 0. The transformers models are wrapped to take `input_ids` (or",
        "`pixel_values`) and return the logits; the decoder-only ones pass an all-ones",
        "attention mask made from `input_ids` (without one, transformers runs",
        "`torch.diff` on the position ids to detect packed sequences, which the legacy",
        "exporter cannot export). `hf-clip-text` adds a Linear head on CLIP's",
        "`pooler_output` inside its wrapper; `hf-bart` derives `decoder_input_ids` from",
        "`input_ids` (`shift_tokens_right`). `unet` and `dcgan-generator` are written",
        "here (not in torchvision) and return per-pixel logits as (N, H, W, classes);",
        "`torch-lstm` is a sequence tagger written here with torch.nn (`Embedding`,",
        "2-layer bidirectional `LSTM`, `GRU`, `Linear`) and returns logits per token.",
        "Attention is `eager` except in `hf-llama-sdpa-*`.",
        "`hf-llama-bf16` is the tiny Llama built with `dtype=torch.bfloat16` (parameters",
        "and activations bfloat16, the rotary `inv_freq` buffer float32), `tv-resnet18-fp16`",
        "is `tv-resnet18` after `.half()` (parameters, buffers and the image float16: the",
        "graph input is float16). Their references are `model.double()` of those same",
        "weights, an exact upcast: the model's function in float64 without rounding to",
        "float16/bfloat16 inside, what pipec computes in float32 from float32 master",
        "copies; the float16 image is stored in the .npz as its (exact) float32 upcast.",
        "Weights are inside each .onnx; the dynamo files lose only their per-node",
        "`pkg.torch.onnx.stack_trace` metadata (the exporting machine's source paths),",
        "the rest of their metadata is kept.",
        "",
        "`<stem>.npz` (`np.load` needs no pickle) holds the graph inputs by name,",
        "`labels` (int64, `logits.shape[:-1]`), `logits` and `loss` (float64:",
        "`F.cross_entropy(logits.reshape(-1, C), labels.reshape(-1))` of the float64",
        "model in train mode, BatchNorm on batch statistics), `grad/<initializer>`",
        "(computed in float64, stored as float32; transposed where the exporter stored a",
        "transposed weight, summed over the parameters it merged into one initializer,",
        "the gradient of one use where it untied a tied weight, permuted alike where it",
        "folded a rearrangement of parameters into one, such as an RNN's weights in",
        "ONNX's gate order with the directions stacked) and `meta`, a JSON",
        "string: exporter and call, opset, op counts, versions, the torch parameter",
        "count, the initializer-to-parameter map, where each parameter went, torch",
        "buffers among the initializers, the other initializers with reasons, and the",
        "largest difference between onnxruntime's logits and torch's (float32) in",
        "train and in eval mode.",
        "",
        f"{len(metas)} models, {total / 2**20:.1f} MiB with their references.",
        "",
        "| file | exporter | opset | .onnx KiB | nodes | initializers | torch params (tensors / values) | grads stored | BatchNorm nodes | onnxruntime vs torch, train / eval |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for meta in metas:
        ort = meta["onnxruntime"]
        ort_s = ("error: " + ort["error"][:60]) if "error" in ort else " / ".join(
            f"{ort[k]:.1e}" if isinstance(ort[k], float) else str(ort[k])
            for k in ("max_abs_diff_vs_torch_train", "max_abs_diff_vs_torch_eval"))
        size = os.path.getsize(os.path.join(out_dir, meta["file"])) / 1024
        bn = ", ".join(f"{n} {form}" for form, n in meta["batchnorm"].items()) or "-"
        lines.append(f"| {meta['file']} | {meta['exporter']} | {meta['opset']} | {size:.0f} | {meta['nodes']} | "
                     f"{meta['initializers']} | {meta['torch_trainable_tensors']} / {meta['torch_trainable_elements']} | "
                     f"{len(meta['initializer_to_parameters'])} | {bn} | {ort_s} |")
    kinds = ["by name", "transposed"] + [k for k, _ in PARAM_KINDS[1:]]
    lines += ["", "## Where the torch parameters went", "",
              "Per file, how many torch parameter tensors are held by an initializer of",
              "their own (by name or by value), as a transpose (the dynamo optimizer folds",
              "`Transpose(W)` into a new initializer `val_N`), merged with other",
              "equal-valued parameters into one initializer (the optimizer deduplicates",
              "equal constants: freshly initialised LayerNorm/RMSNorm weights and zero",
              "biases), a tied weight split into one initializer per use, a convolution",
              "whose initializer holds the weight with BatchNorm folded in, BatchNorm",
              "parameters fused away, all-zero parameters dropped, and parameters folded",
              "into a derived constant (position embeddings gathered at constant positions,",
              "a class token expanded to the batch), and parameters rearranged (their",
              "elements permuted, several concatenated) into a new initializer: an RNN's",
              "weights in ONNX's gate order, directions stacked. Details per parameter in `meta`.",
              "", "| file | " + " | ".join(kinds) + " |", "|---|" + "---|" * len(kinds)]
    for meta in metas:
        counts = parameter_kinds(meta)
        lines.append(f"| {meta['file']} | " + " | ".join(str(counts.get(k, 0) or "") for k in kinds) + " |")
    lines += OBSERVATIONS
    lines += ["", "## Op types (number of files using each)", ""]
    lines.append(", ".join(f"{op} {n}" for op, n in sorted(census.items(), key=lambda kv: (-kv[1], kv[0]))) + ".")
    if status:
        date = datetime.date.today().isoformat()
        lines += ["", f"## pipec import status at the time of export ({date})", "",
                  f"`build/bin/pipec <file>` (import and print a summary) on each file, pipec built from "
                  f"`{git_head()}`. A snapshot, not a test: the importer moves on. Where it imports,",
                  "`build/bin/pipec-reference <file> --loss softmax-cross-entropy` (pipec's evaluator",
                  "and autodiff) ran on the .npz inputs and labels: its loss against the torch",
                  "reference's, and the largest gradient error relative to the reference's largest",
                  "value over the initializers both have. Where the dynamo optimizer folded BatchNorm",
                  "into the convolutions, no importer can recover the training loss: the file is",
                  "another model.", "",
                  "| file | imports | pipec's parameters, or the op types it lacks, or the error's first 300 characters "
                  "| pipec-reference vs the torch reference |",
                  "|---|---|---|---|"]
        for meta in metas:
            ok, summary, lacking = status[meta["file"]]
            detail = summary[len("imports "):] if ok else (", ".join(lacking) if lacking else summary.replace("|", "\\|"))
            check = checks.get(meta["file"], "").replace("|", "\\|")
            lines.append(f"| {meta['file']} | {'yes' if ok else 'no'} | {detail} | {check} |")
    with open(os.path.join(out_dir, "README.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return status, checks


def git_head():
    try:
        return subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"], capture_output=True,
                              text=True).stdout.strip() or "?"
    except OSError:
        return "?"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=HERE)
    parser.add_argument("--only", action="append", help="a family (e.g. hf-llama) or a file stem; repeatable")
    parser.add_argument("--pipec", default=os.path.join(ROOT, "build", "bin", "pipec"),
                        help="pipec binary for the README's import status (skipped when absent)")
    parser.add_argument("--readme-only", action="store_true", help="rewrite README.md from the existing files")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if not args.readme_only:
        got = check_versions()
        failures = []
        for family, (_, exporters, _) in FAMILIES.items():
            for exporter in exporters:
                stem = f"{family}-{exporter}"
                if args.only and family not in args.only and stem not in args.only:
                    continue
                try:
                    meta = export_one(family, exporter, args.out, got)
                except Exception as e:  # noqa: BLE001
                    failures.append((stem, f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}"))
                    traceback.print_exc()
                    print(f"FAILED {stem}: {failures[-1][1]}")
                    continue
                size = os.path.getsize(os.path.join(args.out, stem + ".onnx"))
                print(f"wrote {stem}.onnx ({size} bytes, opset {meta['opset']}, {meta['nodes']} nodes, "
                      f"{meta['initializers']} initializers, {meta['torch_trainable_tensors']} torch parameter "
                      f"tensors, {len(meta['initializer_to_parameters'])} gradients, loss {meta['loss']:.6f})")
                unmapped = [p for p, n in meta["parameters"].items() if not n.startswith(("initializer", "merged", "tied", "rearranged"))]
                if unmapped:
                    print(f"  {len(unmapped)} parameter(s) without a gradient entry, e.g. {unmapped[0]}: "
                          f"{meta['parameters'][unmapped[0]]}")
        for stem, why in failures:
            print(f"FAILED {stem}: {why}")
    status, checks = write_readme(args.out, args.pipec)
    for name, (ok, summary, lacking) in sorted(status.items()):
        print(f"pipec {name}: {summary if ok else 'fails: ' + (', '.join(lacking) or summary)}"
              + (f"; {checks[name]}" if name in checks else ""))


if __name__ == "__main__":
    main()
