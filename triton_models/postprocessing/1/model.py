from trtpd.serving.text_models import Postprocessing as TritonPythonModel  # noqa: F401
