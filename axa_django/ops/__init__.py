"""Operating the queue: fleet figures, health probes, metrics, tracing, the dashboard's data, the connection budget."""
