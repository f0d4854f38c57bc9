rule resolve_launch:
    # The one document every later stage reads. Every preflight check has already passed to get here.
    input:
        GRAPH.marker("launch"),
        model="stage/model/v{version}",
        data="stage/data/v{version}",
    output:
        launch="launch/v{version}/launch.yaml",
        record="launch/v{version}/identity.json",
        plan=report("launch/v{version}/plan.txt", category="Plan", caption="../report/plan.rst"),
    shell:
        "{RLBUILD} resolve-launch {ARGS} --version {wildcards.version} "
        "--out {output.launch} --record {output.record} --plan {output.plan}"
