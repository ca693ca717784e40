# Device helpers for the grid (bench/gpu/grid.py) and tune runs: `source bench/gpu/grid-session.sh` in each call.
# The bundle (scripts/airgap_prepare.py --fa3 --with-fleetgen --chunk-mib 56) travels as .gpu/pNN, one a call.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
PY=/opt/torch/.venv/bin/python3
SITE=/root/site
export PYTHONPATH=$SITE:$SITE/nvidia_cutlass_dsl/python_packages:$PWD/src
take() { mkdir -p /root/in && mv .gpu/p* /root/in/ && ls /root/in | tr '\n' ' ' && du -sh /root/in; }
assemble() {  # the pieces → /root/bundle → installed into $SITE (FA3 put back)
  mkdir -p /root/bundle && cat /root/in/p* | tee >(sha256sum | cut -c1-16 >&2) | tar -x -C /root/bundle &&
    rm -f /root/in/p* && bash /root/bundle/install.sh $SITE $PY > /root/install.log 2>&1; tail -1 /root/install.log
  $PY -c "import sglang, sgl_kernel; from sgl_kernel.flash_attn import flash_attn_with_kvcache; print('sglang', sglang.__version__)" 2>&1 | tail -2
  nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader; }
grid_start() {  # grid_start SETTINGS [args…]: in the background, survives the call
  mkdir -p /root/grid && (setsid nohup $PY bench/gpu/grid.py --model /root/bundle/model --out /root/grid \
    --python $PY --settings "$@" > /root/grid/stdout 2>&1 < /dev/null &); echo grid started; }
grid_wait() {  # grid_wait SECONDS: until the grid says done (or the time), then its files into $OUT
  local s=$SECONDS; while [ $((SECONDS-s)) -lt $1 ]; do grep -q "\[grid\] done" /root/grid/stdout 2>/dev/null && break; sleep 5; done
  cat /root/grid/stdout; cp /root/grid/grid.json $OUT/ 2>/dev/null; tar -cJf $OUT/grid-logs.tar.xz -C /root/grid . 2>/dev/null; ls $OUT; }
# `fleetgen tune` on the device (bench/gpu/sglang-0.5.15-h200-tune.toml): its own folder, in the background
FG="import sys; sys.argv[0] = 'fleetgen'; from fleetgen.cli import main; main()"
tune_start() {  # tune_start ARGS…: fleetgen tune with the H200 files, output in /root/tune-run; the code that
  # runs is /root/fgcode/src when `fg_code` unpacked one (another branch's commit), else the checkout's src
  TUNE_FLEET=${TUNE_FLEET:-bench/gpu/sglang-0.5.15-h200-tune.toml} TUNE_SITE=${TUNE_SITE:-$SITE}
  local code=$PWD; [ -d /root/fgcode/src ] && code=/root/fgcode
  rm -rf /root/tune-run /root/fleetgen-work && mkdir -p /root/tune-run && cp -r bench /root/tune-run/ &&
    cp -r $code/src /root/tune-run/ && { [ ! -d /root/fgcode/bench/gpu ] || cp -r /root/fgcode/bench/gpu/. /root/tune-run/bench/gpu/; } &&
    cd /root/tune-run || return 1
  PYTHONPATH=$TUNE_SITE:/root/tune-run/src $PY -W ignore -c "import fleetgen; print('fleetgen from', fleetgen.__file__)"
  (PYTHONPATH=$TUNE_SITE:/root/tune-run/src setsid nohup $PY -c "$FG" tune -f $TUNE_FLEET \
      --job bench/gpu/tune-job.toml bench/gpu/tune-prompts.jsonl --output-lengths mean=1800,min=300,max=6000 \
      --out /root/tune-run/tuned.toml --json "$@" > /root/tune-run/tune.json 2> /root/tune-run/tune.log < /dev/null &
   echo $! > /root/tune-run/pid)
  echo "tune started: $TUNE_FLEET $*" | tee /root/tune-run/command; cd - > /dev/null; }
# another branch's code, carried as .gpu/fg.tar.gz (`git archive COMMIT src bench/gpu` + a COMMIT file, ~0.4 MiB):
# `fg_code` before `tune_start`
fg_code() { rm -rf /root/fgcode && mkdir -p /root/fgcode && tar -xzf .gpu/fg.tar.gz -C /root/fgcode && cat /root/fgcode/COMMIT; }
tune_running() { kill -0 "$(cat /root/tune-run/pid 2> /dev/null)" 2> /dev/null; }  # by its pid: a pattern
# matched the caller's own command line once (the run's command named it) and waited out the whole call
# vLLM 0.24.0 (bench/gpu/vllm-0.24.0-h200-tune.toml): the bundle's pieces as .gpu/vNN, one a call (`vtake`), then
# `vassemble` (installs into /root/vsite in the foreground), then
# `TUNE_FLEET=bench/gpu/vllm-0.24.0-h200-tune.toml TUNE_SITE=/root/vsite tune_start …`
vtake() { mkdir -p /root/vin && mv .gpu/v* /root/vin/ && ls /root/vin | tr '\n' ' ' && du -sh /root/vin; }
vassemble() {
  mkdir -p /root/vbundle && cat /root/vin/v* | tar -x -C /root/vbundle && rm -f /root/vin/v* &&
    bash /root/vbundle/install.sh /root/vsite $PY > /root/vinstall.log 2>&1; tail -1 /root/vinstall.log
  PYTHONPATH=/root/vsite $PY -c "import vllm; print('vllm', vllm.__version__)" 2>&1 | tail -1; }
tune_wait() {  # tune_wait SECONDS: until tune ends (or the time), then its files into $OUT
  local s=$SECONDS; while [ $((SECONDS-s)) -lt $1 ]; do tune_running || break; sleep 5; done
  tail -30 /root/tune-run/tune.log; cp /root/tune-run/tune.json /root/tune-run/tune.log /root/tune-run/tuned.* $OUT/ 2>/dev/null
  tar -cJf $OUT/tune-work.tar.xz -C /root/tune-run .fleetgen -C /root fleetgen-work --exclude='*.sock' --exclude='*api_key*' 2>/dev/null
  nvidia-smi --query-gpu=memory.used --format=csv,noheader; ls $OUT; }
# SGLang 0.5.17 beside 0.5.15 (bench/gpu/sglang-0.5.17-h200-tune.toml): its bundle's pieces as .gpu/qNN, one a
# call (`qtake`), then `qassemble` (→ /root/bundle17, installed into /root/site17), then
# `TUNE_FLEET=bench/gpu/sglang-0.5.17-h200-tune.toml TUNE_SITE=/root/site17 tune_start …`
qtake() { mkdir -p /root/qin && mv .gpu/q* /root/qin/ && ls /root/qin | tr '\n' ' ' && du -sh /root/qin; }
qassemble() {
  mkdir -p /root/bundle17 && cat /root/qin/q* | tee >(sha256sum | cut -c1-16 >&2) | tar -x -C /root/bundle17 &&
    rm -f /root/qin/q* && bash /root/bundle17/install.sh /root/site17 $PY > /root/install17.log 2>&1; tail -1 /root/install17.log
  PYTHONPATH=/root/site17:/root/site17/nvidia_cutlass_dsl/python_packages $PY -c "import sglang, sgl_kernel; from sgl_kernel.flash_attn import flash_attn_with_kvcache; print('sglang', sglang.__version__)" 2>&1 | tail -2; }
# The driver at 1,000 simulated endpoints on this machine's 16 cores (bench/driver/run_driver.py) before the
# bundle is in: fleetgen's own wheels the image lacks travel as .gpu/fgdeps.tar (`fgdeps`), then
# `driver_start ARGS…` (in the background, its own copy of the code) and `driver_wait SECONDS`
fgdeps() { mkdir -p /root/fgdeps && tar -xf .gpu/fgdeps.tar -C /root/fgdeps && rm -f .gpu/fgdeps.tar &&
  $PY -m pip install -q --no-index --no-deps --no-compile --target /root/fgsite /root/fgdeps/*.whl &&
  echo /root/fgsite > "$($PY -c 'import site; print(site.getsitepackages()[0])')/fgsite.pth" && ls /root/fgsite | wc -l; }
# (on the interpreter's path by a .pth: run_driver.py gives its children PYTHONPATH=the checkout's src)
driver_start() {
  rm -rf /root/drv && mkdir -p /root/drv/tests/data/real-engines/sglang-0.5.15-h200 && cp -r src bench /root/drv/ &&
    cp -r tests/data/real-engines/sglang-0.5.15-h200/mtp /root/drv/tests/data/real-engines/sglang-0.5.15-h200/ || return 1
  (cd /root/drv && PYTHONPATH=/root/fgsite:/root/drv/src FLEETGEN_COMMIT=${FLEETGEN_COMMIT:-device} \
    setsid nohup $PY bench/driver/run_driver.py "$@" > /root/drv/stdout 2>&1 < /dev/null & echo $! > /root/drv/pid)
  echo "driver started: $*"; }
driver_wait() {
  local s=$SECONDS; while [ $((SECONDS-s)) -lt $1 ]; do kill -0 "$(cat /root/drv/pid)" 2>/dev/null || break; sleep 3; done
  tail -12 /root/drv/stdout; mkdir -p $OUT/driver && cp /root/drv/stdout /root/drv/bench/results/driver-*.json $OUT/driver/ 2>/dev/null; ls $OUT/driver; }
# `fleetgen plan --job` for a tune fleet file on this GPU: the candidates' names (for `tune --only`)
tune_plan() {
  PYTHONPATH=${TUNE_SITE:-$SITE}:$PWD/src COLUMNS=250 $PY -W ignore -c "$FG" plan -f ${TUNE_FLEET:-bench/gpu/sglang-0.5.15-h200-tune.toml} \
    --job bench/gpu/tune-job.toml --input bench/gpu/tune-prompts.jsonl 2>&1 | grep -E "│|verdict|GiB" | cut -c1-120; }
