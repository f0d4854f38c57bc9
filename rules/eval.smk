rule eval:
    """Score export/v{version}/model/ on the staged validation set (greedy accuracy, pass@k); write results.json,
    the report's table and the training curves."""
    input:
        GRAPH.marker("eval"),
        launch=ARTIFACT["launch"].path(),
        record=ARTIFACT["launch"].record(),
        model=ARTIFACT["export"].path(),
        data=GRAPH.stage("stage_data"),
    output:
        results=report(ARTIFACT["eval"].path(), category="Eval", caption="../report/eval.rst"),
        table=report("eval/v{version}/results.html", category="Eval", caption="../report/eval.rst"),
        curves=report("eval/v{version}/curves.png", category="Eval", caption="../report/curves.rst"),
        record=ARTIFACT["eval"].record(),
    resources:
        **GRAPH.job_resources("eval"),
    log:
        "logs/eval/v{version}.log",
    params:
        rlbuild=RLBUILD,
        out=lambda wildcards, output: str(Path(output.results).parent),
    shell:
        "{params.rlbuild:q} eval --launch {input.launch:q} --launch-record {input.record:q} "
        "--model {input.model:q} --data {input.data:q} --out {params.out:q} --record {output.record:q} 2> {log:q}"
