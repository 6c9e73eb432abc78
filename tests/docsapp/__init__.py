"""An app that loads one docs page's modules at start-up, so a worker subprocess runs that page's jobs."""
