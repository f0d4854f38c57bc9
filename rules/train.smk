rule train:
    """Train with GRPO to train/v{version}/terminal.json: one gang of whole nodes on a cluster's scheduler (its
    jobs chained past a wall-clock limit where it has one) or a local Ray; resumes from the latest checkpoint, keeps
    every attempt's log in storage."""
    # The GPU gang: under a cluster profile one job of `gpu_nodes` whole nodes, as that scheduler's package asks for
    # it (rlbuild/schedulers/); locally, a local Ray.
    # Every attempt's whole log is also kept in storage, under the run's attempts folder (rlbuild/job/attempt.py).
    input:
        GRAPH.train_inputs,
        launch=ARTIFACT["launch"].path(),
        record=ARTIFACT["launch"].record(),
        model=GRAPH.stage("stage_model"),
        data=GRAPH.stage("stage_data"),
    output:
        terminal=ARTIFACT["train"].path(),
        record=ARTIFACT["train"].record(),
    log:
        "logs/train/v{version}.log",
    resources:
        **GRAPH.gang_resources(),
    params:
        rlbuild=RLBUILD,
    shell:
        "{params.rlbuild:q} train --launch {input.launch:q} --launch-record {input.record:q} "
        "--terminal {output.terminal:q} --record {output.record:q} --max-links {resources.chain_max_links} "
        "--stop-lead {resources.chain_signal_lead_s} 2>&1 | tee {log:q}"
