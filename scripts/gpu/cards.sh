#!/usr/bin/env bash
# Notebook 07's card (tutorial_lib/lessons/card.py) of four models on a GPU node, for docs/performance.md: a small
# GPT on synthetic tokens (6 layers, width 512, sequence 512), torchvision's MobileNetV3-Small, ResNet-50 and ViT-B/16
# at 224x224, never with pretrained weights. Each card takes at most about 170 s on one H200; on a node with 2 or more GPUs
# it then measures DDP beside its prediction (1-3 minutes more). Writes $OUT/card_<model>/card.json and card.md;
# copy card.md to notebooks/reference/07_card_<model>.md. MODELS picks some: MODELS="gpt:tokens" bash ...
set -euo pipefail
OUT=${OUT:-build/gpu/cards}
MODELS=${MODELS:-mobilenet_v3_small:images gpt:tokens resnet50:images vit_b_16:images}
EXAMPLES=tutorial_lib.lessons.card_examples
nvidia-smi -L
for m in $MODELS; do
  model=${m%%:*}
  python3 -m tutorial_lib card "$EXAMPLES:$model" --batch "$EXAMPLES:${m##*:}" "out=$OUT/card_$model" "$@"
done
