"""The documents and typed records trtpd writes and reads, as schemas that depend on nothing of trtpd but a few
leaf modules (errors, catalog, kv.layout, perf.yaml_io, resources).

    manifest   the engine manifest (`manifest.json` per engine folder): build writes, lint and the
               reference engine read it
    plan       the plan file (`trtpd plan` writes; build, simulate and the controller read it)
    slo        the SLO, the one type: the planner's document (configs/slo/), the plan file's record, a deployment
               spec's slo:, the gateway's live goodput, the rollout gate and the autoscaler
    request_sample  a finished request as the gateway keeps it for the controller (GET /admin/requests)
    pbtxt      Triton's config.pbtxt (ModelConfig): repo renders and checks it, lint and build read it
    id_groups  the tensorrtllm `participant_ids` / `gpu_device_ids` format: build writes, lint reads

They sit below trtllm, lint, repo, planner and sim so that none of those packages imports another
one just to name a file format (that is what made build<->lint, build<->repo<->lint and planner<->sim
cycles; tests/unit/test_layout.py keeps them broken).
"""
