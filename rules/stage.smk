rule base_model:
    # The embedded default's tiny Qwen2-style model, built in code and warm-started on the answer format.
    input:
        GRAPH.marker("base_model"),
    output:
        directory("base_model/v{version}"),
    log:
        "logs/base_model/v{version}.log",
    shell:
        "{RLBUILD} base-model {ARGS} --version {wildcards.version} --out {output} 2> {log}"


rule stage_model:
    input:
        unpack(GRAPH.stage_model_inputs),
    output:
        directory("stage/model/v{version}"),
    log:
        "logs/stage_model/v{version}.log",
    params:
        base_model=lambda wildcards, input: f"--base-model {input.base_model}" if "base_model" in input.keys() else "",
    shell:
        "{RLBUILD} stage-model {ARGS} --version {wildcards.version} {params.base_model} --out {output} 2> {log}"


rule stage_data:
    input:
        GRAPH.marker("stage_data"),
    output:
        directory("stage/data/v{version}"),
    log:
        "logs/stage_data/v{version}.log",
    shell:
        "{RLBUILD} stage-data {ARGS} --version {wildcards.version} --out {output} 2> {log}"
