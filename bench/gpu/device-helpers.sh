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
