rule train:
    # The GPU gang: under the iris profile one Iris job of `gpu_nodes` whole nodes; locally, a local Ray.
    input:
        GRAPH.marker("train"),
        launch="launch/v{version}/launch.yaml",
        record="launch/v{version}/identity.json",
        model="stage/model/v{version}",
        data="stage/data/v{version}",
    output:
        terminal="train/v{version}/terminal.json",
        record="train/v{version}/identity.json",
    log:
        "logs/train/v{version}.log",
    resources:
        **GRAPH.gang_resources(),
    shell:
        "{RLBUILD} train --launch {input.launch} --terminal {output.terminal} --record {output.record} "
        "2>&1 | tee {log}"
