rule export:
    # The terminal checkpoint as a Hugging Face folder; re-exporting never retrains.
    input:
        GRAPH.marker("export"),
        launch=ARTIFACT["launch"].path(),
        record=ARTIFACT["launch"].record(),
        terminal=ARTIFACT["train"].path(),
    output:
        directory(ARTIFACT["export"].path()),
    resources:
        **GRAPH.cluster_resources(),
    log:
        "logs/export/v{version}.log",
    shell:
        "{RLBUILD} export --launch {input.launch:q} --terminal {input.terminal:q} --out {output:q} 2> {log:q}"
