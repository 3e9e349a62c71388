"""`trtpd lint`: catch P/D pairs that would start and then crash or hang on the first transfer.

Library entry points (each returns a list of typed `Finding`s):
    lint_engine_pair(prefill, decode, ...)      two EngineManifests
    check_pair(prefill_dir, decode_dir)         the same for two engine folders, errors as messages
    lint_repository(path, launch_script=...)    a rendered Triton model repository
    lint_model_configs({folder: text}, ...)     the same, for configs not yet written
    lint_serve_configs(prefill, decode, router, max_prompt_tokens=..., backend="tensorrt"|"pytorch")
    lint_ports({name: port}, check_free=...)
    lint_deployment(discover(engines/<model>))  everything trtpd build produced
"""

from trtpd.lint.deployment import DeploymentPaths, discover, lint_deployment
from trtpd.lint.engine_pair import check_pair, lint_engine_pair
from trtpd.lint.findings import RULES, Finding, errors, summary
from trtpd.lint.ports import lint_ports
from trtpd.lint.repository import lint_model_configs, lint_repository
from trtpd.lint.serve_configs import lint_serve_configs

__all__ = ["RULES", "DeploymentPaths", "Finding", "check_pair", "discover", "errors", "lint_deployment",
           "lint_engine_pair", "lint_model_configs", "lint_ports", "lint_repository", "lint_serve_configs", "summary"]
