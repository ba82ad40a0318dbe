# Sourced by scripts/gpu/tp.sh and tp1.sh: finds libnccl.so.2 (NCCL_LIB_DIR, the nvidia-nccl-cu13
# or -cu12 wheel of python3's site-packages — torch installs one —, or the system's) and puts
# it on LD_LIBRARY_PATH, because kern loads NCCL at run time like the driver.
find_nccl() {
  local d
  for d in "${NCCL_LIB_DIR:-}" \
      $(python3 - 2>/dev/null <<'PY'
import importlib, os
for m in ("nvidia.nccl",):
    try:
        p = importlib.import_module(m)
        for b in p.__path__:
            print(os.path.join(b, "lib"))
    except Exception:
        pass
PY
      ) /usr/lib/x86_64-linux-gnu /usr/local/nccl/lib; do
    if [[ -n $d && -f $d/libnccl.so.2 ]]; then
      export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      echo "NCCL: $d/libnccl.so.2"
      return 0
    fi
  done
  echo "NCCL not found: set NCCL_LIB_DIR to a directory with libnccl.so.2 (pip download nvidia-nccl-cu13 where there is network, carry its nvidia/nccl/lib)"
  return 1
}
