rule resolve_launch:
    """Resolve the version into launch/v{version}/launch.yaml, the one document every later stage reads (every
    preflight check has passed to get here), with the plan a reviewer reads."""
    input:
        GRAPH.marker("launch"),
        model=GRAPH.stage("stage_model"),
        data=GRAPH.stage("stage_data"),
    output:
        launch=ARTIFACT["launch"].path(),
        plan=report("launch/v{version}/plan.txt", category="Plan", caption="../report/plan.rst"),
        record=ARTIFACT["launch"].record(),  # last: Snakemake uploads outputs in this order
    log:
        "logs/resolve_launch/v{version}.log",
    params:
        rlbuild=RLBUILD,
        args=ARGS,
    shell:
        "{params.rlbuild:q} resolve-launch {params.args:q} --version {wildcards.version:q} "
        "--model {input.model:q} --data {input.data:q} --out {output.launch:q} --record {output.record:q} "
        "--plan {output.plan:q} 2> {log:q}"
