import pytest

from trtpd.catalog import get_model
from trtpd.perf.hardware import load_hardware
from trtpd.planner.inputs import SearchSpace, Slo, Target, load_slo
from trtpd.planner.search import PlanProblem
from trtpd.sim.workload import load_workload


@pytest.fixture(scope="session")
def llama70():
    return get_model("llama-2-70b")


@pytest.fixture(scope="session")
def h100():
    return load_hardware("h100-sxm")


@pytest.fixture(scope="session")
def chat():
    return load_workload("chat-powerlaw")


@pytest.fixture()
def chat_problem(llama70, h100, chat):
    def make(rate_per_s=40.0, slo: Slo | None = None, **space) -> PlanProblem:
        target = Target(rate_per_s=rate_per_s) if rate_per_s else None
        return PlanProblem(llama70, h100, chat, slo or load_slo("chat"), target, SearchSpace(**space))
    return make


@pytest.fixture(scope="session")
def llama70_31():
    return get_model("llama-3.1-70b")
