#!/usr/bin/env bash
# Builds llama.cpp's own OpenAI server (llama-server) and llama-quantize for the serving benchmark
# (attnzoo bench --serve, docs/bench/serve-llama-server.md), from llama-cpp-python 0.3.36's source
# distribution: it carries llama.cpp's sources (vendor/llama.cpp, with tools/server). Same native flags as
# the generation bench's llama.cpp (docs/benchmarks.md: GGML_NATIVE=ON, no curl). Nothing is committed:
# the build lives outside the repository.
#
#   scripts/build_llama_server.sh [DIR]     # DIR defaults to /work/llama-server
#
# Then: DIR/build/bin/llama-server, DIR/build/bin/llama-quantize, and DIR/src/vendor/llama.cpp/gguf-py
# (the GGUF writer bench/gguf_llama.py imports when no `gguf` package is installed).
set -euo pipefail
DIR="${1:-/work/llama-server}"
VERSION=0.3.36
JOBS="${JOBS:-2}"
mkdir -p "$DIR"
cd "$DIR"
if [ ! -f "llama_cpp_python-$VERSION.tar.gz" ]; then
  python3 -m pip download --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d .
fi
if [ ! -d src ]; then
  mkdir -p src
  tar -xzf "llama_cpp_python-$VERSION.tar.gz" -C src --strip-components=1
fi
cmake -S src/vendor/llama.cpp -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DBUILD_SHARED_LIBS=OFF
nice -n 10 cmake --build build -j "$JOBS" --target llama-server llama-quantize
ls -la build/bin/llama-server build/bin/llama-quantize
