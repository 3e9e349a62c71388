from trtpd.serving.role_model import RoleModel as TritonPythonModel  # noqa: F401
