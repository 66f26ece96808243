#!/bin/bash
# Runs the probe under every backend/strategy combination; outputs in out_*.txt
cd /tmp/s37/sglang
for b in python rust; do for s in no_buffer extra_buffer; do
  ./venv/bin/python -W ignore probe.py --backend $b --strategy $s > out_${b}_${s}.txt 2>&1
done; done
./venv/bin/python -W ignore probe.py --eagle > out_python_no_buffer_eagle.txt 2>&1
S=orjson,psutil,pybase64,requests,PIL,starlette,zmq,IPython,aiohttp,tvm_ffi,sentencepiece,compressed_tensors,gguf,partial_json_parser,datasets
PROBE_EXTRA_STUBS=$S ./venv/bin/python -W ignore probe.py --backend rust > out_rust_no_buffer_minstubs.txt 2>&1
