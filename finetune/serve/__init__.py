"""The HTTP server: a trained review classifier behind /predict and /explain, with a page to try it."""
