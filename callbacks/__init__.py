"""Lightning callbacks and loggers: record writers, scoring and reports, stage timing, feature files, training run
folders."""
