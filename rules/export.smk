rule export:
    # The terminal checkpoint as a Hugging Face folder; re-exporting never retrains.
    input:
        GRAPH.marker("export"),
        launch=ARTIFACT["launch"].path(),
        record=ARTIFACT["launch"].record(),
        terminal=ARTIFACT["train"].path(),
    output:
        artifact=directory(ARTIFACT["export"].path()),
        record=ARTIFACT["export"].record(),
    resources:
        **GRAPH.job_resources("export"),
    log:
        "logs/export/v{version}.log",
    params:
        rlbuild=lambda wildcards: RLBUILD,
    shell:
        "{params.rlbuild:q} export --launch {input.launch:q} --launch-record {input.record:q} "
        "--terminal {input.terminal:q} --out {output.artifact:q} --record {output.record:q} 2> {log:q}"
