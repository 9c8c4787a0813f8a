#!/bin/bash
# kiln-tiny on the GPU machine (the `device` tool runs this from the checkout's tree with
# .dev-tiny carried: .dev-tiny/tools = tools/tiny, .dev-tiny/data = the prepared corpus).
#   device.sh smoke          tokenizer on a sample, a few steps of training, export, eval -> $OUT
#   device.sh start MINUTES  full tokenizer, training started under setsid, then tail
#   device.sh wait [SECS]    tail the run; copy results to $OUT once it is done
#   device.sh fetch A B      copy result files whose index in `ls` is in [A, B) to $OUT
set -u
D=$(cd "$(dirname "$0")/.." && pwd)   # .dev-tiny
W=/tmp/tiny
mode=$1
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true
mkdir -p $W
case $mode in
smoke)
  nvidia-smi --query-gpu=name,memory.used --format=csv
  python3 -c 'import torch, tokenizers; print(torch.__version__, tokenizers.__version__)'
  python3 $D/tools/train_tokenizer.py --data $D/data --out $W/tok --sample-mb 5 || exit 1
  python3 $D/tools/train.py --data $D/data --tok $W/tok --out $W/smoke --minutes 1.5 \
    --max-steps 60 --warmup 10 --corpus-mb 20 --compile 2>&1 | tee $OUT/smoke.log
  cp $W/smoke/log.jsonl $W/smoke/eval.json $W/smoke/config.json $W/tok/tokenizer.json \
     $W/tok/tokenizer_ids.json $OUT/ 2>/dev/null
  ls -la $W/smoke
  ;;
start)
  minutes=$2
  python3 $D/tools/train_tokenizer.py --data $D/data --out $W/tok || exit 1
  cp $W/tok/tokenizer.json $W/tok/tokenizer_ids.json $OUT/
  setsid nohup python3 $D/tools/train.py --data $D/data --tok $W/tok --out $W/run \
    --minutes $minutes --compile ${TRAIN_ARGS:-} > $W/run.log 2>&1 < /dev/null &
  sleep 5
  end=$((SECONDS + ${3:-520}))
  while [ $SECONDS -lt $end ] && [ ! -f $W/run/DONE ]; do
    sleep 20
    tail -n 3 $W/run.log
    if ! pgrep -f "tools/train.py" > /dev/null && [ ! -f $W/run/DONE ]; then echo "train.py died"; tail -50 $W/run.log; break; fi
  done
  cp $W/run.log $OUT/
  ;;
wait)
  end=$((SECONDS + ${2:-560}))
  while [ $SECONDS -lt $end ] && [ ! -f $W/run/DONE ]; do
    sleep 20
    tail -n 2 $W/run.log
    if ! pgrep -f "tools/train.py" > /dev/null && [ ! -f $W/run/DONE ]; then echo "train.py died"; tail -50 $W/run.log; break; fi
  done
  cp $W/run.log $OUT/ 2>/dev/null
  if [ -f $W/run/DONE ]; then
    cd $W/run && ls -la
    cp $W/run.log . && tar cf $OUT/results.tar config.json log.jsonl eval.json data_stats.json \
      run.log tokenizer.json tokenizer_config.json tokenizer_ids.json heldout_ppl.txt
    ls *.safetensors | head -n 4 | while read f; do cp $f $OUT/; done
    tail -n 30 $W/run.log
  fi
  ;;
fetch)
  cd $W/run && ls *.safetensors | sed -n "$(($2 + 1)),$3p" | while read f; do cp $f $OUT/; done
  ls -la $OUT
  ;;
esac
