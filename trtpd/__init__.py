"""trtpd: prefill/decode disaggregated LLM serving on TensorRT-LLM 1.2.x and Triton."""

__version__ = "0.1.0"
