"""What a run says: the summary table, report, plots and compare read only the files the
harness wrote (so they work on a run from another machine); verify and predict add the
runs and the model they need through the harness and the workload."""
