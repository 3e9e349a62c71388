"""The compiled simulator modules (trtpd.accel) change no result, and are used only when they are what their
source is now, from a directory only this user can write to.

The equivalence test runs the same plans and simulations in two interpreters, one with every module in
trtpd.accel.MODULES compiled and one with none (TRTPD_NO_ACCEL=1), and compares every timestamp (as
float.hex), counter and plan field exactly. The build is the checkout's own when it is fresh (scripts/setup.sh
makes it), else one made here (about 40 s on 2 cores)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trtpd import accel

REPO = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, sys
from trtpd import accel
from trtpd.catalog import get_model
from trtpd.perf.hardware import load_hardware
from trtpd.planner.inputs import SearchSpace, Target, load_slo
from trtpd.planner.make import VerifyOptions, make_plan
from trtpd.planner.search import PlanProblem
from trtpd.sim.cluster_specs import colocated_cluster, disaggregated_cluster, options_from_plan
from trtpd.sim.simulator import simulate
from trtpd.sim.workload import generate_requests, load_workload

def hexed(values):
    return [v.hex() if isinstance(v, float) else v for v in values]

out = {}
for hw_name, wl_name, slo_name, target in (("h100-sxm", "chat-powerlaw", "chat", Target(rate_per_s=40)),
                                           ("h200", "seed004", "seed004", Target(tokens_per_min=5e6))):
    model, hw, wl = get_model("llama-2-70b"), load_hardware(hw_name), load_workload(wl_name)
    plan = make_plan(PlanProblem(model, hw, wl, load_slo(slo_name), target, SearchSpace()),
                     VerifyOptions(num_requests=1500, compare_requests=300, parallel=False))
    out[wl_name + " plan"] = plan.model_dump(mode="json")
    opts = options_from_plan(plan)
    requests = generate_requests(wl, plan.target.rate_per_s, 2500, seed=3)
    for mode, cluster in (("disaggregated", disaggregated_cluster(model, hw, opts)),
                          ("colocated", colocated_cluster(model, hw, opts))):
        run = simulate(cluster, requests)
        r = run.records
        out[f"{wl_name} {mode}"] = {
            "times": [hexed(t) for t in (r.prefill_start_s, r.prefill_end_s, r.transfer_start_s, r.transfer_end_s,
                                         r.first_token_s, r.done_s)],
            "instances": [r.prefill_instance, r.decode_instance, r.rejected],
            "counts": [r.num_done, run.num_events, run.num_rejected, run.stopped_overloaded],
            "usage": [[u.role, u.index, u.busy_share.hex(), float(u.mean_batch_size).hex()] for u in run.usage],
            "span": [run.span_s.hex(), run.end_s.hex()]}
out["loaded"] = list(accel.status().loaded)
json.dump(out, sys.stdout)
"""


@pytest.fixture(scope="module")
def accel_root(tmp_path_factory) -> Path:
    """A root whose build (root / abi_tag) is fresh for every module."""
    st = accel.status()
    if st.complete:
        return st.directory.parent
    root = tmp_path_factory.mktemp("accel")
    built = accel.build(accel.build_dir(root))
    assert len(built.fresh) == len(accel.MODULES), built.describe()
    return root


def _run(env_extra: dict[str, str], script: str = SCRIPT) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in (accel.DISABLE_ENV, accel.DIR_ENV)}
    env.update(env_extra)
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_compiled_modules_give_the_same_plans_and_runs_bit_for_bit(accel_root):
    compiled = _run({accel.DIR_ENV: str(accel_root)})
    pure = _run({accel.DISABLE_ENV: "1"})
    assert sorted(compiled.pop("loaded")) == sorted(accel.MODULES)      # every module compiled there
    assert pure.pop("loaded") == []                                     # and none here
    assert compiled.keys() == pure.keys()
    for key in pure:
        assert compiled[key] == pure[key], key
    # what was compared: every request finished in each run, and each plan was verified and compared
    for key in ("chat-powerlaw disaggregated", "chat-powerlaw colocated", "seed004 disaggregated",
                "seed004 colocated"):
        assert pure[key]["counts"][0] == 2500 and pure[key]["counts"][1] > 2500, key
    for key in ("chat-powerlaw plan", "seed004 plan"):
        assert pure[key]["verification"]["simulations"] and pure[key]["comparison"]["colocated"], key


def _copy_build(accel_root: Path, tmp_path: Path) -> Path:
    root = tmp_path / "accel"
    root.mkdir(mode=0o700)
    shutil.copytree(accel_root / accel.abi_tag(), root / accel.abi_tag())
    return root


LOADED = "import json, sys, trtpd.sim.events, trtpd.sim.stepping; from trtpd import accel; " \
         "json.dump({'loaded': list(accel.status().loaded), 'events': trtpd.sim.events.__file__}, sys.stdout)"


def test_a_module_built_from_other_source_is_imported_as_python(accel_root, tmp_path):
    root = _copy_build(accel_root, tmp_path)
    manifest_path = root / accel.abi_tag() / accel.MANIFEST
    manifest = json.loads(manifest_path.read_text())
    manifest["modules"]["trtpd.sim.events"]["sha256"] = "0" * 64       # as if events.py changed since
    manifest_path.write_text(json.dumps(manifest))
    out = _run({accel.DIR_ENV: str(root)}, LOADED)
    assert out["events"].endswith("events.py")
    assert "trtpd.sim.stepping" in out["loaded"] and "trtpd.sim.events" not in out["loaded"]
    st = accel.status(root / accel.abi_tag())
    assert st.stale == ("trtpd.sim.events",) and len(st.fresh) == len(accel.MODULES) - 1
    assert "1 stale" in st.describe() and "trtpd.sim.events" in st.describe()


@pytest.mark.parametrize("where,mode", [("build", 0o770), ("build", 0o707), ("parent", 0o770)])
def test_a_build_others_can_write_to_is_not_loaded(accel_root, tmp_path, where, mode):
    root = _copy_build(accel_root, tmp_path)
    (root / accel.abi_tag() if where == "build" else root).chmod(mode)
    out = _run({accel.DIR_ENV: str(root)}, LOADED)
    assert out["loaded"] == [] and out["events"].endswith("events.py")
    st = accel.status(root / accel.abi_tag())
    assert st.problem is not None and "writable by its group or others" in st.problem
    assert "every module is Python" in st.describe()


def test_another_interpreters_build_is_not_loaded(accel_root, tmp_path):
    root = _copy_build(accel_root, tmp_path)
    build = root / accel.abi_tag()
    manifest = json.loads((build / accel.MANIFEST).read_text())
    entry = manifest["modules"]["trtpd.sim.events"]
    other = entry["file"].replace(".cpython-", ".cpython-other-")     # a suffix this interpreter does not load
    (build / entry["file"]).rename(build / other)
    entry["file"] = other
    (build / accel.MANIFEST).write_text(json.dumps(manifest))
    out = _run({accel.DIR_ENV: str(root)}, LOADED)
    assert out["events"].endswith("events.py") and "trtpd.sim.stepping" in out["loaded"]


def test_status_without_a_build_says_so(tmp_path):
    st = accel.status(tmp_path / "nothing" / accel.abi_tag())
    assert st.fresh == () and "not built" in st.describe() and "trtpd accel build" in st.describe()


def test_build_compiles_what_it_is_asked_into_a_private_directory(tmp_path):
    """The build itself (one small module, about 5 s): a directory of mode 0700 with the manifest, used by
    a new interpreter for that module alone."""
    root = tmp_path / "root"
    st = accel.build(accel.build_dir(root), modules=("trtpd.sim.sequence",), jobs=1)
    assert st.fresh == ("trtpd.sim.sequence",) and len(st.missing) == len(accel.MODULES) - 1
    assert (accel.build_dir(root).stat().st_mode & 0o777) == 0o700
    assert not [p for p in root.iterdir() if p.name.startswith(".") and p.is_dir()]   # nothing staged left
    out = _run({accel.DIR_ENV: str(root)}, "import json, sys, trtpd.sim.sequence, trtpd.sim.events; "
               "json.dump([trtpd.sim.sequence.__file__, trtpd.sim.events.__file__], sys.stdout)")
    assert out[0].endswith(".so") and out[1].endswith("events.py")
