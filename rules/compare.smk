rule compare:
    """The series report of version {version}: every arm's curves on shared axes, evals with deltas against the
    base arm, what each arm changes, wall time and GPU-hours (rlbuild/ops/compare.py). Only for a series."""
    input:
        launches=GRAPH.series_files(ARTIFACT["launch"].path()),
        results=GRAPH.series_files(ARTIFACT["eval"].path()),
    output:
        numbers="series/v{version}/compare.json",
        curves=report("series/v{version}/curves.png", category="Series", caption="../report/compare.rst"),
        page=report("series/v{version}/compare.html", category="Series", caption="../report/compare.rst"),
    log:
        "logs/compare/v{version}.log",
    params:
        rlbuild=RLBUILD,
        experiment=EXPERIMENT,
        out=lambda wildcards, output: str(Path(output.page).parent),
    shell:
        "{params.rlbuild:q} compare {params.experiment:q} --version {wildcards.version:q} "
        "--launches {input.launches:q} --results {input.results:q} --out {params.out:q} > {log:q} 2>&1"
