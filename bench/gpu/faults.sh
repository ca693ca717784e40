# lead: prove `up` accepts the real SGLang MTP server now; then a real OOM launch. Results under $OUT.
source /root/tools/dev.sh
assemble_f > $OUT/assemble.txt 2>&1
rm -rf /root/fg && mkdir -p /root/fg && cp -r $R/src /root/fg/
export PYTHONPATH=$SITE:/root/fg/src
fg() { $PY -c "import sys; sys.argv[0] = 'fleetgen'; from fleetgen.cli import main; main()" "$@"; }
F=/root/tools/fleet-sglang.toml
{ date -u +%T.%N; fg up -f $F; echo "rc=$?"; date -u +%T.%N; } > $OUT/up-mtp.txt 2>&1
fg status -f $F --json > $OUT/status-mtp.json 2>&1
{ fg down -f $F; echo "rc=$?"; nvidia-smi --query-gpu=memory.used --format=csv; } > $OUT/down-mtp.txt 2>&1
mkdir -p /root/oom && cp -r /root/fleetgen-work /root/oom/mtp-work 2>/dev/null
# OOM: no speculation, mem-fraction-static 0.99, no model shape here (plan sizing skipped, so the engine itself runs out)
grep -v -e '^speculative' -e '^mamba-radix' $F | sed -e 's/^mem-fraction-static = 0.85/mem-fraction-static = 0.99/' -e 's|^model_config = .*|model_config = "/root/no-shape-here"|' > /root/tools/fleet-oom.toml
{ date -u +%T.%N; timeout 400 $PY -c "import sys; sys.argv[0] = 'fleetgen'; from fleetgen.cli import main; main()" up -f /root/tools/fleet-oom.toml; echo "rc=$?"; date -u +%T.%N; } > $OUT/up-oom.txt 2>&1
{ fg down -f /root/tools/fleet-oom.toml; echo "rc=$?"; nvidia-smi --query-gpu=memory.used --format=csv; } > $OUT/down-oom.txt 2>&1
cp /root/tools/fleet-oom.toml $OUT/
tar -cJf $OUT/logs.tar.xz /root/fleetgen-work /root/oom --exclude='*.sock' --exclude='*api_key*' 2>/dev/null
ls -la $OUT; tail -5 $OUT/up-mtp.txt; tail -12 $OUT/up-oom.txt
