"""trtpd: prefill/decode disaggregated LLM serving on TensorRT-LLM 1.2.x and Triton."""

__version__ = "0.1.0"

# compiled copies of the simulator's hot modules, where built and matching their source (trtpd.accel)
from trtpd import accel as _accel  # noqa: E402

_accel.install()
