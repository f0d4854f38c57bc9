rule export:
    """The terminal checkpoint as a publishable Hugging Face model in export/v{version}/model/ (weights, config,
    tokenizer, generation_config.json, model card); re-exporting never retrains."""
    input:
        GRAPH.marker("export"),
        launch=ARTIFACT["launch"].path(),
        record=ARTIFACT["launch"].record(),
        terminal=ARTIFACT["train"].path(),
        model_record=GRAPH.stage("stage_model", record=True),
        data_record=GRAPH.stage("stage_data", record=True),
    output:
        artifact=directory(ARTIFACT["export"].path()),
        record=ARTIFACT["export"].record(),
    resources:
        **GRAPH.job_resources("export"),
    log:
        "logs/export/v{version}.log",
    params:
        rlbuild=RLBUILD,
        license=GRAPH.experiment.license,
    shell:
        "{params.rlbuild:q} export --launch {input.launch:q} --launch-record {input.record:q} "
        "--terminal {input.terminal:q} --model-record {input.model_record:q} --data-record {input.data_record:q} "
        "--license {params.license:q} --out {output.artifact:q} --record {output.record:q} 2> {log:q}"
