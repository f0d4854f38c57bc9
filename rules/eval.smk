rule eval:
    input:
        GRAPH.marker("eval"),
        launch="launch/v{version}/launch.yaml",
        record="launch/v{version}/identity.json",
        model="export/v{version}",
        data="stage/data/v{version}",
    output:
        results=report("eval/v{version}/results.json", category="Eval", caption="../report/eval.rst"),
        table=report("eval/v{version}/results.html", category="Eval", caption="../report/eval.rst"),
        curves=report("eval/v{version}/curves.png", category="Eval", caption="../report/curves.rst"),
        record="eval/v{version}/identity.json",
    log:
        "logs/eval/v{version}.log",
    shell:
        "{RLBUILD} eval --launch {input.launch} --model {input.model} --data {input.data} "
        "--out $(dirname {output.results}) 2> {log}"
