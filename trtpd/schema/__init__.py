"""The documents trtpd writes and reads, as schemas with no other trtpd dependencies.

    manifest   the engine manifest (`manifest.json` per engine folder): build writes, lint and the
               reference engine read it
    plan       the plan file (`trtpd plan` writes; build, simulate and the controller read it)
    slo        the SLO document (configs/slo/): the planner's input, recorded in the plan file
    pbtxt      Triton's config.pbtxt (ModelConfig): repo renders and checks it, lint and build read it
    id_groups  the tensorrtllm `participant_ids` / `gpu_device_ids` format: build writes, lint reads

They sit below build, lint, repo, planner and sim so that none of those packages imports another
one just to name a file format (that is what made build<->lint, build<->repo<->lint and planner<->sim
cycles; tests/unit/test_layout.py keeps them broken).
"""
