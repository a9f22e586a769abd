"""MLflow: the run, background metric logging, system metrics, model export."""
