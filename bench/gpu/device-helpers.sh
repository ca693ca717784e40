# device helpers: source /root/tools/dev.sh (copied there by the first call)
R=${R:-$PWD}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
SITE=/root/site; PY=/opt/torch/.venv/bin/python3
recv() { mkdir -p /root/in; find "$R/.gpu" -type f \( -name 'apart*' -o -name 'fpart*' \) -exec mv {} /root/in/ \; ; ls /root/in | tr '\n' ' '; du -sh /root/in; }
assemble_a() {
  cat /root/in/apart* > /root/a.tar && sha256sum /root/a.tar | cut -c1-16 && mkdir -p /root/bundle && tar -xf /root/a.tar -C /root/bundle && rm -f /root/a.tar /root/in/apart* &&
  (setsid nohup bash /root/bundle/install.sh $SITE $PY > /root/install.log 2>&1 < /dev/null &) ; echo install started; }
assemble_f() {
  for i in $(seq 1 90); do grep -q "installed into" /root/install.log && break; sleep 2; done; tail -3 /root/install.log
  cat /root/in/fpart* | tee >(sha256sum | cut -c1-16 >&2) | $PY /root/bundle/inflate.py /dev/stdin $SITE/sgl_kernel/flash_ops.abi3.so && ls -la $SITE/sgl_kernel/ && rm -f /root/in/fpart*; }
smoke() { PYTHONPATH=$SITE:$SITE/nvidia_cutlass_dsl/python_packages:$R/src $PY -c "
import sglang, sgl_kernel, cutlass, deep_gemm; from sgl_kernel.flash_attn import flash_attn_with_kvcache; import fleetgen
print('sglang', sglang.__version__, 'fa3 ok')" 2>&1 | tail -3; nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv; }
start_scn() {  # start_scn FLEET OUTDIR [args...]: the whole scenario in the background (survives the call)
  local fleet=$1 out=$2; shift 2; rm -rf /root/fg; mkdir -p /root/fg && cp -r $R/src $R/scripts /root/fg/ && mkdir -p $out
  (cd /root/fg && PYTHONPATH=$SITE:/root/fg/src setsid nohup $PY scripts/gpu_scenario.py -f $fleet --out $out "$@" > $out.stdout 2>&1 < /dev/null &); echo scenario started; }
waitscn() {  # waitscn OUTDIR SECONDS: wait for the scenario's end (or the time), then collect
  local out=$1 t=$2 s=$SECONDS; while [ $((SECONDS-s)) -lt $t ]; do grep -q "wrote $out/gpu-" $out/scenario.log 2>/dev/null && break; pgrep -f "gpu_scenario.py -f" >/dev/null || break; sleep 5; done
  tail -25 $out/scenario.log; collect $out; }
collect() {
  local out=$1; cp $out/gpu-*.json $out/gpu-*.md $out/state.json $out/scenario.log $OUT/ 2>/dev/null
  tar -cJf $OUT/raw.tar.xz -C $out raw $(cd $out && ls -d run-*/results.sqlite 2>/dev/null) /root/install.log /root/fleetgen-work 2>/dev/null --exclude='*.sock'; ls -la $OUT; }
# vLLM: carry .gpu/v01..v04 (recv_v each), then assemble_v; fleet: /root/tools/fleet-vllm.toml
recv_v() { mkdir -p /root/vin; find "$R/.gpu" -type f -name 'vpart*' -exec mv {} /root/vin/ \; ; ls /root/vin | tr '\n' ' '; du -sh /root/vin; }
assemble_v() { mkdir -p /root/vbundle && cat /root/vin/vpart* | tar -x -C /root/vbundle && rm -f /root/vin/vpart* &&
  (setsid nohup bash /root/vbundle/install.sh /root/vsite $PY > /root/vinstall.log 2>&1 < /dev/null &); echo vllm install started; }
# SGLang 0.5.13 (the refusal fault): carry .gpu/s01..s04 (recv_s each; s04 in the last call), assemble_s, then
# fault_refusal bench/gpu/sglang-0.5.13-h200-refusal.toml. Its own site (/root/ssite): nothing shared with 0.5.15.
SSITE=/root/ssite
recv_s() { mkdir -p /root/sin; find "$R/.gpu" -type f -name 'spart*' -exec mv {} /root/sin/ \; ; ls /root/sin | tr '\n' ' '; du -sh /root/sin; }
assemble_s() {  # the bundle's tar (sha256 prefix printed: 5aa5e158c074b01f as built), installed in the foreground
  mkdir -p /root/sbundle && cat /root/sin/spart* | tee >(sha256sum | cut -c1-16 >&2) | tar -x -C /root/sbundle &&
  rm -f /root/sin/spart* && bash /root/sbundle/install.sh $SSITE $PY > /root/sinstall.log 2>&1; tail -2 /root/sinstall.log; }
FGMAIN="import sys; sys.argv[0] = 'fleetgen'; from fleetgen.cli import main; main()"
fgt() { local t=$1; shift; timeout $t $PY -c "$FGMAIN" "$@"; }  # fgt SECONDS ARGS: fleetgen, time-limited
fault_refusal() {  # fault_refusal FLEET [SITE]: SGLang's own refusal of spec + no_buffer + radix; files in $OUT/refusal
  local F=$1 site=${2:-$SSITE} o=$OUT/refusal; mkdir -p $o; cp $F $o/
  rm -rf /root/fg && mkdir -p /root/fg && cp -r $R/src /root/fg/ && export PYTHONPATH=$site:/root/fg/src
  # the first import of SGLang compiles its bytecode (install.sh: --no-compile): it happens here, not in plan
  timeout 240 $PY -c "import sglang, transformers, sglang.srt.server_args; print('sglang', sglang.__version__, 'transformers', transformers.__version__)" > $o/versions.txt 2>&1
  # 1. plan online: fleetgen's own rule (spec-no-buffer-radix) and the host's SGLang parser (from_cli_args runs
  #    __post_init__, where 0.5.13 raises) — both should name the refusal
  fgt 180 plan -f $F --json > $o/plan.json 2> $o/plan-json.stderr
  { fgt 150 plan -f $F; echo "rc=$?"; } > $o/plan.txt 2>&1
  # 2. up refuses before starting anything (plan's per-instance rules, when the model's config.json is
  #    readable here); then up --no-plan-check launches, the engine refuses in __post_init__ and
  #    deploy.readywait's fatal signature names it (cause, log lines, fix)
  { date -u +%T.%N; fgt 120 up -f $F; echo "rc=$?"; date -u +%T.%N; } > $o/up-checked.txt 2>&1
  { date -u +%T.%N; fgt 240 up -f $F --no-plan-check; echo "rc=$?"; date -u +%T.%N; } > $o/up.txt 2>&1
  fgt 30 logs --fleet $F -n 80 h200-0 > $o/logs.txt 2>&1
  { fgt 60 down -f $F; echo "rc=$?"; } > $o/down.txt 2>&1
  # 3. the engine alone (no fleetgen): the plan's own launch line and env, its log verbatim
  (cd /root && $PY - "$o/plan.json" > $o/engine-alone.log 2>&1 <<'PYEOF'
import json, os, signal, subprocess, sys
i = json.load(open(sys.argv[1]))["instances"][0]
p = subprocess.Popen(i["argv"], env={**os.environ, **i["env"]}, start_new_session=True)
try:
    print("rc=%s" % p.wait(150))
except subprocess.TimeoutExpired:  # it did not refuse: stop it and its workers (its own process group)
    os.killpg(p.pid, signal.SIGKILL)
    print("rc=timeout: the engine did not refuse within 150 s (killed)")
PYEOF
  )
  nvidia-smi --query-gpu=memory.used --format=csv >> $o/down.txt
  tar -cJf $o/work.tar.xz /root/fleetgen-work --exclude='*.sock' --exclude='*api_key*' 2>/dev/null
  cat $o/versions.txt; grep -h -e rc= -e "error\|fix" $o/plan.txt | head -8; tail -4 $o/up-checked.txt; tail -14 $o/up.txt; tail -3 $o/engine-alone.log; }
