from trtpd.serving.text_models import Preprocessing as TritonPythonModel  # noqa: F401
