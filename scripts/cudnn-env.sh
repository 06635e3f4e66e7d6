# Sourced by the device scripts that call cuDNN: puts PyTorch's cuDNN on LD_LIBRARY_PATH and sets $cudnn_lib. It is
# the first nvidia/cudnn/lib (the nvidia-cudnn wheel) or torch/lib on python's path that holds libcudnn.so* (a
# `nvidia.cudnn.__file__` lookup fails: a namespace package has none).
cudnn_lib=$(python3 - <<'PY' 2>/dev/null
import glob, os, sys
for p in sys.path:
    for d in (os.path.join(p, "nvidia", "cudnn", "lib"), os.path.join(p, "torch", "lib")):
        if glob.glob(os.path.join(d, "libcudnn.so*")):
            print(d)
            sys.exit()
PY
)
export LD_LIBRARY_PATH=${cudnn_lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
