from trtpd.serving.bls_model import DisaggBls as TritonPythonModel  # noqa: F401
