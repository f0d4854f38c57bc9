rule train:
    # The GPU gang: under the iris profile one Iris job of `gpu_nodes` whole nodes; under the slurm profile one
    # Slurm job of whole nodes, chained past its wall-clock limit (rlbuild/chain.py); locally, a local Ray.
    input:
        GRAPH.marker("train"),
        launch=ARTIFACT["launch"].path(),
        record=ARTIFACT["launch"].record(),
        model=ARTIFACT["stage_model"].path(),
        data=ARTIFACT["stage_data"].path(),
    output:
        terminal=ARTIFACT["train"].path(),
        record=ARTIFACT["train"].record(),
    log:
        "logs/train/v{version}.log",
    resources:
        **GRAPH.gang_resources(),
    shell:
        "{RLBUILD} train --launch {input.launch:q} --terminal {output.terminal:q} --record {output.record:q} "
        "--max-links {resources.chain_max_links} --stop-lead {resources.chain_signal_lead_s} 2>&1 | tee {log:q}"
