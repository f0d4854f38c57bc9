rule export:
    # The terminal checkpoint as a Hugging Face folder; re-exporting never retrains.
    input:
        GRAPH.marker("export"),
        launch="launch/v{version}/launch.yaml",
        record="launch/v{version}/identity.json",
        terminal="train/v{version}/terminal.json",
    output:
        directory("export/v{version}"),
    log:
        "logs/export/v{version}.log",
    shell:
        "{RLBUILD} export --launch {input.launch} --terminal {input.terminal} --out {output} 2> {log}"
