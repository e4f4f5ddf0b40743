#!/usr/bin/env bash
# session 6 call B1: the 7B at 512k, one step, from the binary built in call A (HEAD 51c0c6e),
# started in its own process session so that it outlives this call; call B2 collects it.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p /tmp/mtdeps && for d in third_party/debs/*.deb; do dpkg -x "$d" /tmp/mtdeps; done
rm -rf /tmp/l512 && mkdir -p /tmp/l512/repo /tmp/l512/out
cp -r scripts bench /tmp/l512/repo/ && cp prebuilt/megatrain /tmp/l512/megatrain
cd /tmp/l512/repo
setsid nohup env MT_BIN=/tmp/l512/megatrain OUT=/tmp/l512/out STEPS=1 CONFIG=bench/configs/qwen2.5-7b-512k.json \
  ATTN=cudnn STATE=compact bash scripts/gpu-longctx-check.sh 512k > /tmp/l512/driver.log 2>&1 < /dev/null &
echo "started $(date -u +%T)"
( while :; do nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader >> /tmp/l512/smi.log; free -g | sed -n 2p >> /tmp/l512/free.log; sleep 20; done ) > /dev/null 2>&1 &
smi=$!
for i in $(seq 1 57); do
  sleep 10
  pgrep -f "megatrain train" > /dev/null || { echo "train process gone after ~$((i*10)) s"; break; }
done
kill $smi 2>/dev/null
echo "at $(date -u +%T):"; tail -3 /tmp/l512/smi.log; tail -2 /tmp/l512/free.log
cp /tmp/l512/out/* /tmp/l512/driver.log /tmp/l512/smi.log $OUT/ 2>/dev/null
cat /tmp/l512/out/longctx.log 2>/dev/null | tail -30
