"""Hooks for the whole suite. They live here, at the top of tests/, because under pytest-xdist
(``make test`` runs in parallel) only this conftest is loaded in the controlling process, which
is where the terminal summary is written."""

from __future__ import annotations

import pytest

# The user property under which store/lakefs_conformance/test_lakefs_wrapper_suite.py records the
# counts of lakeFS's own suite; pytest_terminal_summary below prints them.
SUITE_PROPERTY = "lakefs_wrapper_suite"


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """Print lakeFS's wrapper suite's own counts where ``make test`` shows them: that suite runs
    as one test here, whose "1 passed" would hide how many of lakeFS's tests ran, skipped or
    were deselected, and why. Read from the test reports, which xdist's workers send back with
    their user properties."""
    reports = [r for name, rows in terminalreporter.stats.items() if name != "warnings" for r in rows
               if getattr(r, "when", None) == "call"]
    for report in reports:
        for name, value in getattr(report, "user_properties", ()):
            if name == SUITE_PROPERTY:
                terminalreporter.write_sep("-", "lakeFS's own wrapper tests (tests/store/lakefs_conformance)")
                terminalreporter.write_line(str(value))


# ---------------------------------------------------------------- make test and make test-all
# make test (`-m "not heavy and not full"`) leaves these to make test-all, which CI runs. Each entry
# is a node id prefix (a file, a test, or a test with its parameters) and the reason: another
# test in make test already runs that path end to end, so these add cases, not layers. They are
# listed here rather than marked in their files so the split between the suites reads in one
# place; every entry must still match a test (checked when the whole suite is collected).
FULL_ONLY: dict[str, str] = {
    # The user-path matrix: make test keeps the team location's train and predict cases (the path
    # a team outside the repository takes); the platform pipeline's cases and the kill, hang, NaN
    # and sweep cases repeat paths that runtime/test_torchrun, test_guards_torchrun and
    # experiments/test_sweep_trials cover in make test.
    "tests/user_paths/test_user_path_matrix.py::test_trains_and_registers_with_the_override_recorded[platform]":
        "the team variant stays; pipeline/test_end_to_end trains the shipped pipeline",
    "tests/user_paths/test_user_path_matrix.py::test_predict_agrees_with_the_registered_metrics[platform]":
        "the team variant stays",
    "tests/user_paths/test_user_path_matrix.py::test_a_nan_stops_the_run_once_naming_step_and_rank_and_keeps_the_last_good_checkpoint":
        "runtime/test_guards_torchrun's NaN stop stays",
    "tests/user_paths/test_user_path_matrix.py::test_a_killed_rank_resumes_to_equal_weights":
        "runtime/test_torchrun's sigkill resume stays",
    "tests/user_paths/test_user_path_matrix.py::test_a_hanging_rank_is_caught_by_the_watchdog_with_stacks_and_resumes":
        "runtime/test_guards_torchrun's hang stays",
    "tests/user_paths/test_user_path_matrix.py::test_a_sweep_of_two_trials_registers_its_best_trial":
        "experiments/test_sweep_trials stays",
    # Real torchrun: make test keeps the baseline run, one sigkill resume, the checksum stop and
    # one 2-rank FSDP save.
    "tests/runtime/test_torchrun.py::test_a_user_training_function_resumes_after_sigkill_to_the_uninterrupted_weights":
        "the built-in trainer's sigkill resume stays",
    "tests/runtime/test_torchrun.py::test_a_user_function_killed_before_its_first_checkpoint_fails_and_says_so":
        "a failure's message once: ops/test_restart_reporting's step failure stays",
    "tests/runtime/test_torchrun.py::test_fsdp_matches_ddp_and_skips_a_corrupt_checkpoint_on_resume":
        "distributed/test_fsdp_save's 2-rank FSDP run stays",
    "tests/runtime/test_torchrun.py::test_hsdp_with_deterministic_kernels_and_clipping_trains_like_ddp":
        "another sharding of the same loop",
    "tests/runtime/test_torchrun.py::test_identical_runs_end_with_identical_weights":
        "the sigkill resume stays, which must equal an uninterrupted run's weights",
    "tests/runtime/test_sharded_checkpoint.py::test_each_rank_writes_only_its_own_shards":
        "the 2-rank FSDP keep-best save stays, and the sharded checkpoint's unit tests",
    "tests/data/test_v1_versions.py::test_an_old_version_retrains_to_the_same_model_and_figures":
        "a retraining of an old record; the old records' reading tests stay",
    "tests/distributed/test_fsdp_save.py::test_two_fsdp_ranks_write_the_whole_model_once":
        "the 2-rank keep-best save stays",
    "tests/runtime/test_evaluate.py::test_fsdp_training_evaluates_its_keep_best_weights_as_the_step_would":
        "the 2-rank keep-best save stays",
    "tests/runtime/test_sample_order_resume.py":
        "resumes at another world size; runtime/test_sample_order's unit tests of the order stay",
    "tests/runtime/test_sharded_checkpoint.py::test_a_kill_resumes_from_sharded_checkpoints_to_the_uninterrupted_weights":
        "each rank's own shards stays, and the sigkill resume",
    "tests/runtime/test_tensorboard_log.py::test_a_killed_and_resumed_torchrun_run_leaves_one_curve_beside_its_checkpoints":
        "a resume again, for its curve",
    "tests/runtime/test_byte_stable_artifacts.py":
        "fresh processes saving the same state; the in-process checks stay",
    "tests/runtime/test_stream_s3.py::test_an_s3_store_that_stays_down_fails_the_run_naming_the_shard_and_the_endpoint":
        "streaming from S3 with a bounded cache stays",
    # Guards under torchrun: make test keeps the stopped rank (a hang, stacks, restart), the NaN
    # stop and the import failures.
    "tests/runtime/test_guards_torchrun.py::test_a_nan_batch_within_the_skip_allowance_is_skipped_and_recorded":
        "the NaN stop stays",
    "tests/runtime/test_guards_torchrun.py::test_a_straggler_and_a_data_stall_are_named":
        "the detectors' unit tests stay",
    "tests/runtime/test_user_loop_guards.py::test_a_hung_rank_is_caught_with_stacks_and_the_restarted_attempt_resumes":
        "the built-in trainer's hang stays",
    "tests/runtime/test_user_loop_guards.py::test_a_nan_stops_the_run_once_naming_step_and_rank_and_keeps_the_last_good_checkpoint":
        "the built-in trainer's NaN stop stays",
    "tests/runtime/test_user_loop_guards.py::test_a_straggler_and_a_data_stall_in_a_training_function_are_named":
        "the detectors' unit tests stay",
    "tests/distributed/test_multinode_restart.py::test_a_peer_of_a_rank_0_stopped_while_hosting_the_store_ends_and_the_gang_meets_again":
        "a two-node gang meeting again stays",
    "tests/distributed/test_multinode_restart.py::test_a_two_node_gang_meets_again_after_one_node_restarts[1]":
        "the same with the other node restarted",
    # Pipelines through Dagster: make test keeps the demo job, the failed gate, a team's own loop
    # and task, and the team job from its folder.
    "tests/pipeline/test_pipelines.py::test_shared_shards_two_models_one_commit_and_a_second_dataset_beside":
        "one dataset version, more models",
    "tests/pipeline/test_task_pipelines.py::test_regression_version_serves_its_own_test_figures_from_the_card_alone":
        "another task on the same pipeline",
    "tests/pipeline/test_task_pipelines.py::test_language_model_version_records_perplexity_samples_and_serves_text":
        "another task on the same pipeline",
    "tests/pipeline/test_dataset_reuse.py::test_unchanged_data_reuses_its_version_and_commit_after_a_failed_gate":
        "the failed gate stays (pipeline/test_end_to_end)",
    "tests/pipeline/test_evaluate_on_training.py":
        "the registered metrics are checked by the demo job's test",
    "tests/pipeline/test_live_monitoring.py":
        "telemetry reaching Dagster: runtime/test_pipes stays",
    "tests/cli/test_stale_sources.py::test_train_after_the_sources_changed_makes_the_new_version_and_sources_stay_in_one_place":
        "three trainings of a team's image folder; the sources' unit tests stay",
    "tests/cli/test_cli_integration.py::test_compare_puts_two_versions_side_by_side":
        "the CLI's other commands stay",
    "tests/cli/test_cli_integration.py::test_reproduce_retrains_from_the_lineage_record_and_reports_differences":
        "a retraining; data/test_v1_versions stays",
    "tests/experiments/test_experiments_cli.py::test_train_with_overrides_records_them_and_tags_the_run":
        "overrides: the user-path matrix's team train stays",
    "tests/experiments/test_sweep_pipeline.py::test_the_best_trial_is_registered_with_every_trial_in_its_lineage":
        "experiments/test_sweep_trials stays",
    "tests/teams/test_shared_dataset_across_locations.py":
        "team locations: teams/test_team_locations and test_team_job_from_its_folder stay",
    "tests/teams/test_team_image_parts.py":
        "a team's image folder (about 40 s): data/test_image_ingest_steps (ingest over steps) and "
        "data/test_image_parts (a grown folder keeps its parts) stay",
    "tests/serving/test_diabetes_served_from_card.py":
        "every row of one export; serving's unit tests stay",
    # Failures reaching the user: the step failure's cause once stays.
    "tests/ops/test_restart_reporting.py::test_a_killed_rank_restarts_without_pipes_warnings_keeping_both_attempts_figures":
        "the pipes handler's unit tests of both attempts stay",
    "tests/ops/test_restart_reporting.py::test_a_hangs_stacks_reach_the_event_log_and_its_check_warns_naming_the_hang":
        "the hang's stacks: runtime/test_guards_torchrun stays",
    "tests/ops/test_rank_logs.py::test_every_rank_and_attempt_of_a_failing_local_training_is_kept":
        "the rank logs' unit tests stay",
    "tests/ops/test_training_failures.py::test_a_nan_in_a_real_training_fails_the_step_once_keeping_its_last_good_checkpoint":
        "the NaN stop stays (runtime/test_guards_torchrun)",
    # Reliability classes at test size: make reliability runs them at full size.
    "tests/reliability/test_backend_outages.py::test_s3_server_stopped_mid_run_then_restarted":
        "the store outages' cases stay",
    "tests/reliability/test_worker_faults.py":
        "the sigkill resume stays (runtime/test_torchrun)",
    "tests/reliability/test_pinned_reads.py":
        "pinned reads' unit tests stay",
    "tests/reliability/test_secrets_and_lakefs_pipeline.py":
        "lakeFS: store/test_lakefs_store and lakeFS's own suite stay",
    # Kubernetes: the two-pod gloo job and a failing pod stay.
    "tests/k8s/test_pod_simulation.py::test_a_pipeline_with_its_own_model_and_training_function_trains_from_the_image":
        "the two-pod job stays",
    "tests/k8s/test_pod_simulation.py::test_a_pod_whose_image_records_another_commit_fails_naming_both":
        "k8s/test_user_code_image's stale image stays",
    "tests/k8s/test_tensorboard_chart.py::test_tensorboard_reads_the_s3_logdir_with_a_read_only_key_and_sees_the_curve_grow":
        "the chart's rendering tests stay",
    "tests/reliability/test_elastic_faults.py":
        "a node lost above min and rejoining: distributed/test_elastic_gang stays",
    "tests/k8s/test_elastic_pods.py":
        "the local elastic gang (distributed/test_elastic_gang) and the elastic manifests stay",
    "tests/k8s/test_elastic_pipeline.py":
        "a whole pipeline over 3 simulated pods, 160 s: the local elastic gang and the pod simulation's runs stay",
    "tests/teams/test_elastic_team_gang.py":
        "a team's elastic gang through the CLI, 75 s: distributed/test_elastic_gang (a team train_fn) and the "
        "user-path matrix's team location stay",
    "tests/reliability/test_data_faults.py":
        "runtime/test_stream_s3 (store down, cut connections) and data/test_stream_cache (corrupt, full) stay",
    # Steps of a dataset in parts as pods and processes: make test keeps an image folder's shard steps
    # as pods (one killed), a table's groups as pods, and a table's groups as processes.
    "tests/k8s/test_image_ingest_pods.py": "ingest groups as pods, 87 s: k8s/test_step_pods' shard steps stay",
    "tests/k8s/test_text_step_pods.py": "a corpus's groups as pods, 56 s: k8s/test_step_pods' shard steps stay",
    "tests/k8s/test_table_ingest_pods.py": "a table's ingest pod killed, 57 s: pipeline/test_table_ingest_steps' "
                                           "retried group stays",
    "tests/k8s/test_step_pods.py::test_a_tables_shard_step_whose_pod_dies_is_retried_alone_and_the_version_is_whole":
        "a table's group pod killed, 32 s: the image shard step's killed pod stays",
    "tests/data/test_image_ingest_steps.py::test_run_with_the_multiprocess_executor_the_groups_ingest_in_processes_of_their_own_and_make_the_same_raw_copy":
        "image ingest groups as processes, 57 s: pipeline/test_local_executor's table groups stay",
    # The browser: make test keeps tests/ui/test_ui (asset graph, a launched run, the pages).
    "tests/ui/test_live_plots.py": "a training watched live; ui/test_ui stays",
    "tests/ui/test_live_tensorboard.py": "a training watched live; ui/test_ui stays",
    "tests/ui/test_launchpad_override.py": "launches from the UI; ui/test_ui's GraphQL launch stays",
    "tests/ui/test_tensorboard_ui.py": "TensorBoard's page; ui/test_ui stays",
}


@pytest.hookimpl(tryfirst=True)  # before the mark plugin deselects by -m
def pytest_collection_modifyitems(config, items) -> None:
    matched: set[str] = set()
    for item in items:
        for prefix in FULL_ONLY:
            if item.nodeid == prefix or item.nodeid.startswith((prefix + "::", prefix + "[")):
                item.add_marker(pytest.mark.full)
                matched.add(prefix)
    whole_suite = [str(a).rstrip("/") for a in config.args] == ["tests"] and not config.option.keyword
    stale = sorted(set(FULL_ONLY) - matched)
    if whole_suite and stale:
        raise pytest.UsageError(f"tests/conftest.py FULL_ONLY names tests that no longer exist: {stale}")
