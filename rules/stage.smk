rule base_model:
    """Build the embedded default's tiny Qwen2-style model in code, warm-started on the answer format."""
    input:
        GRAPH.marker("base_model"),
    output:
        artifact=directory(ARTIFACT["base_model"].path()),
        record=ARTIFACT["base_model"].record(),
    log:
        "logs/base_model/v{version}.log",
    params:
        rlbuild=RLBUILD,
        args=ARGS,
    shell:
        "{params.rlbuild:q} base-model {params.args:q} --version {wildcards.version:q} --out {output.artifact:q} "
        "--record {output.record:q} 2> {log:q}"


rule stage_model:
    """Stage the model and tokenizer sources (hf:, local:, artifact:) into a folder with a manifest."""
    input:
        unpack(GRAPH.stage_model_inputs),
    output:
        artifact=directory(ARTIFACT["stage_model"].path()),
        record=ARTIFACT["stage_model"].record(),
    log:
        "logs/stage_model/v{version}.log",
    params:
        rlbuild=RLBUILD,
        args=ARGS,
        base_model=lambda wildcards, input: (
            ["--base-model", input.base_model] if "base_model" in input.keys() else []
        ),
    shell:
        "{params.rlbuild:q} stage-model {params.args:q} --version {wildcards.version:q} {params.base_model:q} "
        "--out {output.artifact:q} --record {output.record:q} 2> {log:q}"


rule stage_data:
    """Stage the train and validation data sources (hf:, local:, task:) as JSONL rows with a manifest."""
    input:
        GRAPH.marker("stage_data"),
    output:
        artifact=directory(ARTIFACT["stage_data"].path()),
        record=ARTIFACT["stage_data"].record(),
    log:
        "logs/stage_data/v{version}.log",
    params:
        rlbuild=RLBUILD,
        args=ARGS,
    shell:
        "{params.rlbuild:q} stage-data {params.args:q} --version {wildcards.version:q} --out {output.artifact:q} "
        "--record {output.record:q} 2> {log:q}"
