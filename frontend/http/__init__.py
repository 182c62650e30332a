"""The HTTP edge: the app, its route table, middlewares (auth, limits, drain, errors), writes."""
