rule publish:
    """Upload export/v{version}/model/ to the Hub repo of execution.publish (HF_TOKEN from the environment) with
    the eval stage's results in its card, tag it per version, and record the published revision. Off unless the
    experiment sets execution.publish."""
    input:
        model=ARTIFACT["export"].path(),
        record=ARTIFACT["export"].record(),
        results=ARTIFACT["eval"].path(),
    output:
        "publish/v{version}.json",
    log:
        "logs/publish/v{version}.log",
    params:
        rlbuild=RLBUILD,
        experiment=EXPERIMENT,
    shell:
        "{params.rlbuild:q} publish --experiment {params.experiment:q} --version {wildcards.version:q} "
        "--model {input.model:q} --results {input.results:q} --out {output:q} 2> {log:q}"
