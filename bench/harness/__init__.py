"""How a run happens: plan the matrix, launch each cell's ranks, train through a strategy
under the probes, and write the records (runs.csv, steps.csv) the analysis reads."""
